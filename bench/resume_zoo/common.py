"""The resume zoo's tiny training run: a correct kill-and-resume loop that each zoo script breaks in one place.

96 random samples of 8 features, 4 classes, an MLP with dropout (the global RNG matters), AdamW, a
warm-up lr schedule, an EMA of the weights, a GradScaler (in fp32, where scaling by a power of two is exact: the
weights are those of a run without it, and its scale and growth tracker still move as under fp16), batches of 8 (12 steps an epoch) in an order that depends
only on (seed, epoch), a checkpoint every ``--every`` steps and at each epoch end (after its
evaluation), written atomically. A zoo script subclasses :class:`Run` and overrides one method with
its upstream bug; ``correct.py`` is the class as it is. Each run takes a second or two, mostly
``import torch``.

    python bench/resume_zoo/correct.py --out runs/x [--resume]
"""
from __future__ import annotations

import argparse
import os
import random
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from course_utils.ema import EMA

BATCH, SAMPLES = 8, 96


class Run:
    """One process of the tiny run: build, maybe restore, train to ``--steps``."""

    workers = 0
    dropout = 0.3
    left_out: tuple[str, ...] = ()  # parts of the state the checkpoint forgets (the zoo's "not saved" bugs)

    def __init__(self) -> None:
        p = argparse.ArgumentParser()
        p.add_argument("--out", required=True)
        p.add_argument("--resume", action="store_true")
        p.add_argument("--steps", type=int, default=36)
        p.add_argument("--every", type=int, default=3)
        p.add_argument("--seed", type=int, default=0)
        self.args = p.parse_args()
        self.seed_all(self.args.seed)
        data = torch.Generator().manual_seed(1234)
        self.train = TensorDataset(torch.randn(SAMPLES, 8, generator=data), torch.randint(0, 4, (SAMPLES,), generator=data))
        self.val = TensorDataset(torch.randn(32, 8, generator=data), torch.randint(0, 4, (32,), generator=data))
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(self.dropout), nn.Linear(16, 4))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / 10))
        self.ema = EMA(self.model, decay=0.9)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=4)  # the scale doubles every 4 steps
        self.step = self.epoch = self.batch = 0  # optimizer steps done; the epoch; its batches done
        self.path = Path(self.args.out) / "ckpt.pt"

    @staticmethod
    def seed_all(seed: int) -> None:
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)

    def loader(self, epoch: int) -> DataLoader:
        order = torch.Generator().manual_seed(self.args.seed * 1000 + epoch)  # the order: (seed, epoch) only
        return DataLoader(self.train, BATCH, sampler=RandomSampler(self.train, generator=order),
                          num_workers=self.workers, generator=torch.Generator().manual_seed(epoch))

    def state(self) -> dict:
        state = {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
                 "ema": self.ema.state_dict(), "scaler": self.scaler.state_dict(), "where": (self.step, self.epoch, self.batch),
                 "rng": (torch.get_rng_state(), np.random.get_state(), random.getstate())}
        return {k: v for k, v in state.items() if k not in self.left_out}

    def restore(self, s: dict) -> None:
        """What the checkpoint holds; a part it lacks stays as built (how such a bug goes unnoticed)."""
        for key, part in (("model", self.model), ("opt", self.opt), ("sched", self.sched), ("ema", self.ema),
                          ("scaler", self.scaler)):
            if key in s:
                part.load_state_dict(s[key])
        self.step, self.epoch, self.batch = s["where"]
        if "rng" in s:
            torch.set_rng_state(s["rng"][0])
            np.random.set_state(s["rng"][1])
            random.setstate(s["rng"][2])

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.state(), self.path.with_suffix(".tmp"))
        os.replace(self.path.with_suffix(".tmp"), self.path)

    def evaluate(self) -> float:
        self.model.eval()
        with torch.no_grad():  # a plain DataLoader: each iter() draws a seed from the global generator
            loss = sum(nn.functional.cross_entropy(self.ema.module(x), y).item() for x, y in DataLoader(self.val, 16))
        self.model.train()
        return loss

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.backward(nn.functional.cross_entropy(self.model(x), y))
        self.update()

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def update(self) -> None:
        self.scaler.step(self.opt)  # unscales the gradients; steps unless one is inf or nan
        self.scaler.update()
        self.opt.zero_grad()
        self.sched.step()
        self.ema.update(self.model)
        self.step += 1

    def end_epoch(self) -> None:
        self.epoch, self.batch = self.epoch + 1, 0
        self.evaluate()
        self.save()

    def batches(self):
        """The epoch's batches from where the run stands: skip those already trained."""
        for i, (x, y) in enumerate(self.loader(self.epoch)):
            if i >= self.batch:
                yield x, y

    def main(self) -> None:
        if self.args.resume and self.path.exists():
            self.restore(torch.load(self.path, weights_only=False))
        while self.step < self.args.steps:
            for x, y in self.batches():
                self.train_step(x, y)
                self.batch += 1
                if self.step % self.args.every == 0:
                    self.save()
                if self.step >= self.args.steps:
                    return
            self.end_epoch()


if __name__ == "__main__":
    Run().main()
