"""PyTorch Lightning as its users write it: a LightningModule, a shuffled DataLoader with worker processes,
the default end-of-epoch ``ModelCheckpoint`` with ``save_last``, and ``fit(ckpt_path=...)`` to resume.

    python lightning_run.py --out runs/l [--resume]
"""

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from task import BATCH, EPOCHS, WINDOWS, TinyLM, TokenWindows, command_line, lm_loss, lr_factor


class LitLM(L.LightningModule):
    def __init__(self, total_steps: int) -> None:
        super().__init__()
        self.model, self.total_steps = TinyLM(), total_steps

    def training_step(self, batch, batch_idx):
        return lm_loss(self.model, *batch)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3, weight_decay=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, self.total_steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main() -> None:
    args = command_line()
    out = args.out
    L.seed_everything(0, workers=True, verbose=False)
    data = TokenWindows(WINDOWS, seed=0)
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=2)
    trainer = L.Trainer(max_epochs=EPOCHS, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=out,
                        callbacks=[ModelCheckpoint(dirpath=out / "checkpoints", save_last=True)])
    last = out / "checkpoints" / "last.ckpt"
    trainer.fit(LitLM(EPOCHS * len(loader)), loader, ckpt_path=last if args.resume and last.exists() else None)


if __name__ == "__main__":
    main()
