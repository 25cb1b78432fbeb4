"""Hugging Face Accelerate as its users write it (its docs' pattern): ``prepare`` everything, ``save_state`` every
step into automatically named folders, and on resume ``load_state`` then ``skip_first_batches`` for the part of the
epoch already done; the step counter is a registered object. ``--seedable-sampler`` turns on the option its docs
give for reproducible shuffling (``DataLoaderConfiguration(use_seedable_sampler=True)``).

    python accelerate_run.py --out runs/a [--seedable-sampler] [--resume]
"""

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed
from torch.utils.data import DataLoader

from task import BATCH, EPOCHS, WINDOWS, TinyLM, TokenWindows, command_line, lm_loss, lr_factor


class Progress:
    """The optimizer steps done, saved and loaded by ``save_state`` / ``load_state``."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]


def main() -> None:
    args = command_line("--seedable-sampler")
    out = args.out
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=str(out), automatic_checkpoint_naming=True, total_limit=2),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=args.seedable_sampler))
    set_seed(0)
    loader = DataLoader(TokenWindows(WINDOWS, seed=0), batch_size=BATCH, shuffle=True)
    total = EPOCHS * len(loader)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if args.resume and (out / "checkpoints").is_dir():
        accelerator.load_state()
    start_epoch, done = divmod(progress.step, len(loader))
    model.train()
    for epoch in range(start_epoch, EPOCHS):
        batches = accelerator.skip_first_batches(loader, done) if epoch == start_epoch and done else loader
        for x, y in batches:
            loss = lm_loss(model, x, y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.step += 1
            accelerator.save_state()


if __name__ == "__main__":
    main()
