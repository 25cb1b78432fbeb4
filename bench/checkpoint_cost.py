"""Checkpoint cost: save/load time of a full training state, CheckpointManager against plain torch.save/load.

Two models: the course's SmallCNN (width 32) and an MLP of about 100 M parameters. The
state saved is what train_cifar_pro.py saves: ``training_state(model, AdamW after one
step, scheduler, EMA, RNG, ...)``, so the file holds the weights three times (weights,
EMA weights) plus AdamW's two moments: ~16 bytes per parameter.

Timed operations (repeats alternate plain/managed so that noise hits both):
- ``torch.save(state, path)``                 plain, no fsync (the OS may hold it in memory)
- ``CheckpointManager.save``                  serialise to bytes, SHA-256, temp file + fsync +
                                              os.replace + directory fsync, sidecar, pruning
- ``torch.load(path, weights_only=True)``     plain
- ``load_verified(path)``                     read, check SHA-256, torch.load
- ``CheckpointManager.load_latest()``         list the folder, then load_verified
plus the parts of a managed save (serialise / hash / atomic write) and the training stall:
the training loop waits for the whole save (flush metrics, gather state, save), measured
inside a loop of real steps and given in steps lost.

Loads read a file that was just written, so it comes from the page cache (a cold read
from disk would add the disk's read time).

    python bench/checkpoint_cost.py
    python bench/checkpoint_cost.py --big-params 2e7 --repeats 2      # quicker
"""
from __future__ import annotations

import argparse
import hashlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import format_table, header, machine_info, spread, write_json  # noqa: E402

from course_utils.checkpoint import CheckpointManager, atomic_write_bytes, load_verified, training_state  # noqa: E402
from course_utils.ema import EMA  # noqa: E402
from course_utils.models import build_model, count_parameters  # noqa: E402
from course_utils.schedule import make_scheduler  # noqa: E402


class BigMLP(nn.Module):
    """``layers`` square Linear layers of size ``dim`` (about ``layers * dim**2`` parameters)."""

    def __init__(self, dim: int, layers: int, num_classes: int = 10) -> None:
        super().__init__()
        blocks = []
        for _ in range(layers):
            blocks += [nn.Linear(dim, dim), nn.ReLU()]
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(dim, num_classes)
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class Trainer:
    """Model + AdamW + schedule + EMA, one step at a time; ``state()`` is the script's checkpoint."""

    def __init__(self, model: nn.Module, make_input) -> None:
        self.model = model.train()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=5e-4)
        self.scheduler = make_scheduler(self.optimizer, 10, 1000)
        self.ema = EMA(model, decay=0.999, warmup=True)
        self.make_input = make_input
        self.steps = 0

    def step(self) -> float:
        start = time.perf_counter()
        x, y = self.make_input()
        loss = F.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0, foreach=True)
        self.optimizer.step()
        self.scheduler.step()
        self.ema.update(self.model)
        self.steps += 1
        return time.perf_counter() - start

    def state(self) -> dict:
        return training_state(model=self.model, optimizer=self.optimizer, scheduler=self.scheduler, ema=self.ema,
                              epoch=0, step=self.steps, batch_in_epoch=self.steps, config={"bench": "checkpoint"})


def build(kind: str, big_params: float) -> tuple[str, Trainer]:
    torch.manual_seed(0)
    if kind == "small":
        model = build_model("small", width=32)
        x, y = torch.randn(128, 3, 32, 32), torch.randint(0, 10, (128,))
        return "SmallCNN (width 32, batch 128)", Trainer(model, lambda: (x, y))
    layers = 6
    dim = int(round((big_params / layers) ** 0.5 / 64) * 64)
    model = BigMLP(dim, layers)
    x, y = torch.randn(8, dim), torch.randint(0, 10, (8,))
    return f"MLP {layers}x{dim} (batch 8)", Trainer(model, lambda: (x, y))


def time_it(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_model(kind: str, big_params: float, repeats: int, stall_steps: int, tmp: Path, log=print) -> dict:
    name, trainer = build(kind, big_params)
    params = count_parameters(trainer.model)
    trainer.step()  # AdamW moments exist now, as in any real checkpoint
    state = trainer.state()
    folder = tmp / kind
    manager = CheckpointManager(folder / "managed", keep_last=2)
    plain = folder / "plain.pt"
    plain.parent.mkdir(parents=True, exist_ok=True)
    t: dict[str, list[float]] = {k: [] for k in ("plain save", "manager save", "plain load", "load_verified",
                                                  "manager load_latest", "  serialise", "  sha256",
                                                  "  atomic write+fsync")}
    size = 0
    for r in range(repeats):
        order = ("plain", "managed") if r % 2 == 0 else ("managed", "plain")
        for which in order:
            if which == "plain":
                t["plain save"].append(time_it(lambda: torch.save(state, plain)))
                t["plain load"].append(time_it(lambda: torch.load(plain, map_location="cpu", weights_only=True)))
            else:
                step = 1000 + r
                t["manager save"].append(time_it(lambda: manager.save(state, step)))
                path = manager.checkpoints()[-1]
                size = path.stat().st_size
                t["load_verified"].append(time_it(lambda: load_verified(path)))
                t["manager load_latest"].append(time_it(lambda: manager.load_latest()))
        # the parts of a managed save, done by hand the way save_verified does them
        buf = io.BytesIO()
        t["  serialise"].append(time_it(lambda: torch.save(state, buf)))
        payload = buf.getvalue()
        t["  sha256"].append(time_it(lambda: hashlib.sha256(payload).hexdigest()))
        t["  atomic write+fsync"].append(time_it(lambda: atomic_write_bytes(folder / "parts.pt", payload)))
        del buf, payload
        log(f"  {kind} repeat {r + 1}/{repeats}: plain save {t['plain save'][-1]:.3f}s, "
            f"manager save {t['manager save'][-1]:.3f}s")
    # training stall: real steps, one save in the middle; the loop waits for the whole save
    step_times = [trainer.step() for _ in range(stall_steps)]
    stall_mgr = CheckpointManager(folder / "stall", keep_last=2)
    stall = time_it(lambda: stall_mgr.save(trainer.state(), trainer.steps))
    step_times += [trainer.step() for _ in range(stall_steps)]
    step_s = statistics.median(step_times)
    return {"name": name, "params": params, "file_mb": size / 2**20,
            "times": {k: spread(v) for k, v in t.items()},
            "step_s": step_s, "stall_s": stall, "stall_steps": stall / step_s,
            "slowdown_at_every_200": stall / (200 * step_s)}


def report(results: list[dict]) -> str:
    ops = ["plain save", "manager save", "  serialise", "  sha256", "  atomic write+fsync",
           "plain load", "load_verified", "manager load_latest"]
    headers = ["seconds (median, min-max)", *[f"{r['name']}: {r['params'] / 1e6:.1f} M params, "
                                              f"{r['file_mb']:.0f} MB" for r in results]]
    rows = []
    for op in ops:
        cells = [op]
        for r in results:
            s = r["times"][op]
            cells.append(f"{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})")
        rows.append(cells)
    rows.append(["manager save / plain save", *[f"{r['times']['manager save']['median'] / r['times']['plain save']['median']:.2f}x"
                                                for r in results]])
    rows.append(["load_verified / plain load", *[f"{r['times']['load_verified']['median'] / r['times']['plain load']['median']:.2f}x"
                                                 for r in results]])
    text = format_table(rows, headers)
    stall_rows = [[r["name"], r["step_s"], r["stall_s"], r["stall_steps"], f"{100 * r['slowdown_at_every_200']:.2f}%"]
                  for r in results]
    text += "\n\ntraining stall of one save (the loop waits for it):\n" + format_table(
        stall_rows, ["model", "step s (median)", "save stall s", "steps lost", "slowdown if saved every 200 steps"])
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="repeats for the small CNN")
    p.add_argument("--big-repeats", type=int, default=3, help="repeats for the big model")
    p.add_argument("--big-params", type=float, default=1e8, help="parameters of the big model (0: skip it)")
    p.add_argument("--stall-steps", type=int, default=3, help="training steps before and after the stall save")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default); see overhead.py")
    p.add_argument("--dir", default=None, help="folder for the files (default: a temp folder on the repo's disk)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine_info(torch.device("cpu"))
    print(header(info))
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-", dir=args.dir) as tmp:
        results.append(bench_model("small", 0, args.repeats, max(args.stall_steps, 5), Path(tmp)))
        if args.big_params > 0:
            results.append(bench_model("big", args.big_params, args.big_repeats, args.stall_steps, Path(tmp)))
    text = report(results)
    print()
    print(text)
    path = write_json("checkpoint_cost", {"machine": info, "results": results, "table": text}, args.json)
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
