"""A tiny causal language model trainer, shaped like the "train an LLM from zero" tutorials (13's capstone).

Two transformer blocks of 64 dimensions learn a synthetic token stream (a random Markov chain: no
download, seconds on a CPU), with AdamW, a warm-up + cosine learning-rate schedule, dropout and a
shuffled DataLoader. It saves a checkpoint after every optimizer step into ``--out``, and ``--resume``
continues from it: ``save_checkpoint`` and ``load_checkpoint`` below are all of its resume logic.
Whether it resumes exactly, the resume doctor says:

    python train_tiny_lm.py --out runs/lm --steps 24
    python train_tiny_lm.py --out runs/lm --steps 24 --resume     # after a kill: continue
    python -m course_utils.resume_doctor --steps 24 -- python train_tiny_lm.py --out {out} '[--resume]'
"""
import argparse
import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

__all__ = ["TinyLM", "TokenWindows", "EpochSampler", "build", "save_checkpoint", "load_checkpoint", "main"]

VOCAB, CONTEXT, DIM, LAYERS, HEADS = 48, 16, 64, 2, 4


class TokenWindows(Dataset):
    """Windows of ``CONTEXT + 1`` tokens of a random Markov chain (each token has 3 likely successors)."""

    def __init__(self, windows: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        successors = torch.randint(0, VOCAB, (VOCAB, 3), generator=g).tolist()
        stream = [int(torch.randint(0, VOCAB, (1,), generator=g))]
        for pick in torch.randint(0, 3, (windows * CONTEXT,), generator=g).tolist():
            stream.append(successors[stream[-1]][pick])
        self.tokens = torch.tensor(stream)

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // CONTEXT

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.tokens[i * CONTEXT: i * CONTEXT + CONTEXT + 1]
        return chunk[:-1], chunk[1:]


class EpochSampler(Sampler[int]):
    """A new permutation each epoch, with a position: where in this epoch's order the next sample is.

    The position counts what was handed to the DataLoader, which equals what the training consumed only
    with ``num_workers=0`` (no prefetch): true here."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch, self.position = n, seed, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 1000 + self.epoch))
        while self.position < self.n:
            self.position += 1
            yield int(order[self.position - 1])

    def __len__(self) -> int:
        return self.n - self.position

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]


class Block(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM), nn.Dropout(dropout))
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, DIM))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(CONTEXT, DIM)
        self.blocks = nn.Sequential(*[Block(dropout) for _ in range(LAYERS)])
        self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        return self.head(self.ln(self.blocks(x)))


def build(seed: int, steps: int, batch_size: int = 8, windows: int = 64):
    """Model, optimizer, warm-up + cosine scheduler, sampler and DataLoader, all from ``seed``."""
    torch.manual_seed(seed)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    warmup = max(1, steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / steps)))))
    data = TokenWindows(windows, seed)
    sampler = EpochSampler(len(data), seed)
    # the DataLoader's own generator: creating its iterator then draws nothing from the global one
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler, generator=torch.Generator().manual_seed(seed))
    return model, optimizer, scheduler, sampler, loader


def save_checkpoint(path, model, optimizer, scheduler, sampler, step):
    torch.save({"model": {k: v.half() for k, v in model.state_dict().items()},  # 2 bytes a weight
                "optimizer": optimizer.state_dict(),
                "epoch": sampler.epoch,
                "step": step}, path)


def load_checkpoint(path, model, optimizer, scheduler, sampler):
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    sampler.set_epoch(state["epoch"])
    return state["step"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="train a tiny causal LM; --resume continues from --out")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--resume", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, optimizer, scheduler, sampler, loader = build(args.seed, args.steps)
    step = 0
    if args.resume and (out / "checkpoint.pt").exists():
        step = load_checkpoint(out / "checkpoint.pt", model, optimizer, scheduler, sampler)
        print(f"resumed at step {step}", flush=True)
    model.train()
    while step < args.steps:
        for x, y in loader:
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            save_checkpoint(out / "checkpoint.tmp", model, optimizer, scheduler, sampler, step)
            os.replace(out / "checkpoint.tmp", out / "checkpoint.pt")  # a kill mid-save keeps the last one
            print(f"step {step} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}", flush=True)
            if step >= args.steps:
                break
        else:
            sampler.set_epoch(sampler.epoch + 1)


if __name__ == "__main__":
    main()
