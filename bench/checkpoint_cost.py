"""Checkpoint cost, side by side with plain torch.save/torch.load: time, memory, training stall.

The state saved is what train_cifar_pro.py saves, for an MLP of about 100 M parameters:
``training_state(model, AdamW after one step, scheduler, EMA, RNG, ...)``, ~16 bytes per
parameter (weights, EMA weights, AdamW's two moments). Every comparison runs in this one
process run, on the same disk, with the variants interleaved (their order rotates from repeat
to repeat, so the noise of a shared machine hits all of them); the verdicts use medians.

Targets, as medians (exit status 1 when one is missed; every table shows median, min and max):
1. save: ``CheckpointManager.save`` (synchronous: xxh3-128 of every byte on its way to the file,
   temp file, fsync, rename, sidecar, pruning) <= 1.10x ``torch.save`` + ``fsync`` of the same
   state, every variant writing a new file per save and keeping its newest 2 (see ``bench_save``).
   Durability is the floor; ``torch.save`` without fsync is shown beside it;
2. load: ``load_verified`` (the open file hashed through a read-only mapping, then loaded)
   <= 1.10x ``torch.load(weights_only=True)``, each in a fresh process, as a resume loads it (the
   file is in the page cache: just written). The same pair inside one process that has loaded
   it before is shown too, without a target: there ``torch.load`` reuses memory the allocator
   already holds and runs at memory speed;
3. memory: the peak extra resident memory of a synchronous managed save <= 10% of the state
   (a fresh process per variant; Linux peak RSS reset through /proc/self/clear_refs);
4. stall: with ``AsyncCheckpointManager`` the loop waits only for a copy of the state to host memory:
   the stall per save <= 0.3x a plain ``torch.save`` of the same state. Measured inside a loop
   of real training steps that saves every ``--save-every`` steps (never at the last one), next
   to the same loop with synchronous saves and without saves (end-to-end steps/s, the final
   wait for the last background write included). The first asynchronous save also allocates the host buffers
   (later ones reuse them): it is the maximum of the stall column.

Beside them, without a target: the speed of the two hashes a sidecar can name (xxh3-128, the
one new sidecars use, and SHA-256, the one older sidecars hold) over the checkpoint file in
the page cache (``durable.file_digest``), the source of the speed ratio ``durable`` quotes.

    python bench/checkpoint_cost.py                  # 100 M parameters: ~10 minutes on 2 quiet cores
    python bench/checkpoint_cost.py --params 2e6 --repeats 2 --train-repeats 2 --steps 6 --save-every 2  # smoke
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, format_table, header, machine_info, spread, write_json  # noqa: E402

from course_utils.checkpoint import CheckpointManager, load_verified, training_state  # noqa: E402
from course_utils.checkpoint_async import AsyncCheckpointManager  # noqa: E402
from course_utils.durable import file_digest  # noqa: E402
from course_utils.ema import EMA  # noqa: E402
from course_utils.models import count_parameters  # noqa: E402
from course_utils.schedule import make_scheduler  # noqa: E402

TARGETS = {"save": 1.10, "load": 1.10, "memory": 0.10, "stall": 0.3}


class BigMLP(nn.Module):
    """``layers`` square Linear layers of size ``dim`` (about ``layers * dim**2`` parameters)."""

    def __init__(self, dim: int, layers: int, num_classes: int = 10) -> None:
        super().__init__()
        blocks = []
        for _ in range(layers):
            blocks += [nn.Linear(dim, dim), nn.ReLU()]
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class Trainer:
    """Model + AdamW + schedule + EMA, one step at a time; ``state()`` is the script's checkpoint."""

    def __init__(self, params: float) -> None:
        torch.manual_seed(0)
        layers = 6
        dim = max(64, int(round((params / layers) ** 0.5 / 64) * 64))
        self.name = f"MLP {layers}x{dim} (batch 8)"
        self.model = BigMLP(dim, layers).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=5e-4)
        self.scheduler = make_scheduler(self.optimizer, 10, 1000)
        self.ema = EMA(self.model, decay=0.999, warmup=True)
        self.x, self.y = torch.randn(8, dim), torch.randint(0, 10, (8,))
        self.steps = 0
        self.step()  # AdamW's moments exist now, as in any real checkpoint

    def step(self) -> None:
        loss = F.cross_entropy(self.model(self.x), self.y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0, foreach=True)
        self.optimizer.step()
        self.scheduler.step()
        self.ema.update(self.model)
        self.steps += 1

    def state(self) -> dict:
        return training_state(model=self.model, optimizer=self.optimizer, scheduler=self.scheduler, ema=self.ema,
                              epoch=0, step=self.steps, batch_in_epoch=self.steps, config={"bench": "checkpoint"})


def state_bytes(state: dict) -> int:
    """Bytes of tensor data in ``state`` (each storage once)."""
    seen: dict[int, int] = {}

    def walk(obj) -> None:
        if isinstance(obj, torch.Tensor):
            seen[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)
    walk(state)
    return sum(seen.values())


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rotate(names: list[str], r: int) -> list[str]:
    """The order of the variants in repeat ``r``: each variant takes each position in turn."""
    k = r % len(names)
    return names[k:] + names[:k]


# ---------------------------------------------------------------- 1. save
def bench_save(state: dict, folder: Path, repeats: int, log) -> dict[str, list[float]]:
    """Each variant writes a new file per save and keeps its newest 2, as ``CheckpointManager(keep_last=2)``.

    Why the same retention: on the virtual disk of our CI-class machine, a save that first deletes
    its only file was much faster than one that keeps older files (likely the blocks just freed are
    cheaper to write than fresh ones on a thin-provisioned disk). Measured there: ``torch.save`` + fsync that unlinked its only file
    first took a median 1.4 s, the same write keeping the last 2 files 3.6-5.5 s, about what
    the manager took with no hash at all. Comparing a delete-then-write baseline with a manager
    that keeps 2 checkpoints measures the disk, not the checkpoint code.
    """
    manager = CheckpointManager(folder / "managed", keep_last=2)
    written: dict[bool, list[Path]] = {False: [], True: []}

    def plain_save(sync: bool, r: int) -> None:
        path = folder / f"plain_{'fsync' if sync else 'nosync'}_{r}.pt"
        torch.save(state, path)
        if sync:
            fsync_file(path)
        written[sync].append(path)
        while len(written[sync]) > 2:  # keep the newest 2, as the manager does
            written[sync].pop(0).unlink()
    times: dict[str, list[float]] = {"torch.save": [], "torch.save + fsync": [], "CheckpointManager.save": []}
    for r in range(repeats):
        variants = {"torch.save": lambda: plain_save(False, r), "torch.save + fsync": lambda: plain_save(True, r),
                    "CheckpointManager.save": lambda: manager.save(state, r)}
        for name in rotate(list(variants), r):
            times[name].append(timed(variants[name]))
        log(f"  save repeat {r + 1}/{repeats}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()))
    return times


# ---------------------------------------------------------------- 2. load (and 3. memory): fresh processes
def child(args: argparse.Namespace) -> int:
    """One measurement in this fresh process; prints one JSON line."""
    torch.set_num_threads(args.threads or torch.get_num_threads())
    kind, _, variant = args.child.partition(":")
    path = Path(args.path)
    if kind == "load":
        load = {"torch.load": lambda: torch.load(path, map_location="cpu", weights_only=True),
                "load_verified": lambda: load_verified(path)}[variant]
        start = time.perf_counter()
        load()
        print(json.dumps({"seconds": time.perf_counter() - start}))
        return 0
    trainer = Trainer(args.params)
    state = trainer.state()
    save = {"torch.save": lambda: torch.save(state, path),
            "CheckpointManager.save": lambda: CheckpointManager(path.parent).save(state, 1),
            "CheckpointManager.save async": lambda: _async_save(state, path.parent)}[variant]
    gc.collect()
    base = _reset_peak()
    save()
    print(json.dumps({"extra_bytes": _peak() - base, "state_bytes": state_bytes(state)}))
    return 0


def _async_save(state: dict, folder: Path) -> None:
    manager = AsyncCheckpointManager(folder)
    manager.save(state, 1)
    manager.wait()


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> int:
    """Reset the peak-RSS mark (Linux >= 4.0); return the current RSS, the baseline."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_bytes("VmRSS")


def _peak() -> int:
    return _status_bytes("VmHWM")


def in_child(args: argparse.Namespace, what: str, path: Path) -> dict:
    command = [sys.executable, __file__, "--child", what, "--path", str(path), "--params", str(args.params),
               "--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_load(state: dict, folder: Path, args: argparse.Namespace, log) -> dict:
    manager = CheckpointManager(folder / "load", keep_last=1)
    path = manager.save(state, 1)
    fresh: dict[str, list[float]] = {"torch.load": [], "load_verified": []}
    warm: dict[str, list[float]] = {"torch.load": [], "load_verified": []}
    in_process = {"torch.load": lambda: torch.load(path, map_location="cpu", weights_only=True),
                  "load_verified": lambda: load_verified(path)}
    for name in in_process:  # once each: the allocator now holds the memory a load needs
        in_process[name]()
    hashes: dict[str, list[float]] = {"xxh3_128": [], "sha256": []}
    for r in range(args.repeats):
        for name in rotate(list(fresh), r):
            fresh[name].append(in_child(args, f"load:{name}", path)["seconds"])
        for name in rotate(list(warm), r):
            warm[name].append(timed(in_process[name]))
        for algorithm in rotate(list(hashes), r):
            with open(path, "rb") as f:
                hashes[algorithm].append(timed(lambda: file_digest(f, algorithm)))
        log(f"  load repeat {r + 1}/{args.repeats}: fresh process "
            + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in fresh.items()))
    return {"fresh": fresh, "warm": warm, "hash": hashes, "file_bytes": path.stat().st_size}


def bench_memory(folder: Path, args: argparse.Namespace, log) -> dict[str, dict]:
    out = {}
    for i, variant in enumerate(["torch.save", "CheckpointManager.save", "CheckpointManager.save async"]):
        sub = folder / f"memory{i}"
        sub.mkdir()
        out[variant] = in_child(args, f"memory:{variant}", sub / "plain.pt")
        log(f"  memory {variant}: +{out[variant]['extra_bytes'] / 2**20:.0f} MB")
    return out


# ---------------------------------------------------------------- 4. stall and throughput
def bench_training(trainer: Trainer, folder: Path, args: argparse.Namespace, log) -> dict[str, dict]:
    """Runs of ``--steps`` training steps that save every ``--save-every`` steps: per-save stall and steps/s.

    No save at the last step: every save is followed by training, as in a long run, where the
    wait for the last background write at the very end happens once.
    """
    managers = {"sync saves": CheckpointManager(folder / "sync", keep_last=2),
                "async saves": AsyncCheckpointManager(folder / "async", keep_last=2)}
    results: dict[str, dict[str, list[float]]] = {k: {"seconds": [], "stalls": []}
                                                  for k in ("no saves", "sync saves", "async saves")}
    for r in range(args.train_repeats):
        for mode in rotate(list(results), r):
            manager = managers.get(mode)
            start = time.perf_counter()
            for i in range(1, args.steps + 1):
                trainer.step()
                if manager is not None and i % args.save_every == 0 and i < args.steps:
                    results[mode]["stalls"].append(timed(lambda: manager.save(trainer.state(), trainer.steps)))
            if manager is not None:
                manager.wait()  # the end of a run waits for the write in flight
            results[mode]["seconds"].append(time.perf_counter() - start)
        log(f"  training repeat {r + 1}/{args.train_repeats}: "
            + ", ".join(f"{k} {args.steps / v['seconds'][-1]:.3f} steps/s" for k, v in results.items()))
    return results


# ---------------------------------------------------------------- report
def median(xs: list[float]) -> float:
    return statistics.median(xs)


def cell(xs: list[float]) -> str:
    s = spread(xs)
    return f"{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})"


def report(r: dict) -> tuple[str, dict[str, float]]:
    save, load, memory, training = r["save"], r["load"], r["memory"], r["training"]
    size = r["state_bytes"]
    floor = median(save["torch.save + fsync"])
    ratios = {
        "save": median(save["CheckpointManager.save"]) / floor,
        "load": median(load["fresh"]["load_verified"]) / median(load["fresh"]["torch.load"]),
        "memory": memory["CheckpointManager.save"]["extra_bytes"] / size,
        "stall": median(training["async saves"]["stalls"]) / median(save["torch.save"]),
    }
    rows = [[name, cell(times), f"{median(times) / floor:.2f}x"] for name, times in save.items()]
    text = (f"{r['name']}: {r['params'] / 1e6:.1f} M parameters, state {size / 2**20:.0f} MB, "
            f"file {r['file_bytes'] / 2**20:.0f} MB; {r['repeats']} interleaved repeats "
            f"({r['train_repeats']} of the training runs)\n\n")
    text += "save\n" + format_table(rows, ["seconds (median, min-max)", "time", "/ torch.save + fsync"])
    warm = load["warm"]
    rows = [[f"{name}, fresh process", cell(load["fresh"][name]),
             f"{median(load['fresh'][name]) / median(load['fresh']['torch.load']):.2f}x"] for name in load["fresh"]]
    rows += [[f"{name}, same process again (no target)", cell(warm[name]),
              f"{median(warm[name]) / median(warm['torch.load']):.2f}x"] for name in warm]
    text += "\n\nload\n" + format_table(rows, ["seconds (median, min-max)", "time", "/ torch.load"])
    rows = [[algorithm, cell(times), f"{load['file_bytes'] / median(times) / 1e9:.1f}"]
            for algorithm, times in load["hash"].items()]
    text += "\n\nhash of the file in the page cache (no target)\n" + format_table(
        rows, ["hash", "seconds (median, min-max)", "GB/s"])
    rows = [[name, f"{m['extra_bytes'] / 2**20:.0f}", f"{100 * m['extra_bytes'] / size:.1f}%"]
            for name, m in memory.items()]
    text += "\n\npeak extra resident memory of one save (fresh process)\n" + format_table(
        rows, ["save", "MB", "% of the state"])
    plain_s = median(save["torch.save"])
    rows = []
    for mode, m in training.items():
        stalls = m["stalls"]
        rows.append([mode, f"{r['steps'] / median(m['seconds']):.3f}",
                     f"{median(m['seconds']) / median(training['no saves']['seconds']):.3f}",
                     cell(stalls) if stalls else "-", f"{median(stalls) / plain_s:.2f}x" if stalls else "-"])
    text += (f"\n\ntraining: {r['steps']} steps per run, a save every {r['save_every']} steps, none at the last "
             f"(a step: {median(training['no saves']['seconds']) / r['steps']:.2f} s)\n") + format_table(
        rows, ["mode", "steps/s", "time / no saves", "stall per save s (median, min-max)", "stall / torch.save"])
    verdicts = [
        ["save: CheckpointManager.save / (torch.save + fsync)", f"{ratios['save']:.2f}x", f"<= {TARGETS['save']}x"],
        ["load: load_verified / torch.load (fresh process)", f"{ratios['load']:.2f}x", f"<= {TARGETS['load']}x"],
        ["memory: synchronous save, extra / state", f"{100 * ratios['memory']:.1f}%",
         f"<= {100 * TARGETS['memory']:.0f}%"],
        ["stall: async save / torch.save", f"{ratios['stall']:.2f}x", f"<= {TARGETS['stall']}x"],
    ]
    for row, key in zip(verdicts, ratios):
        row.append("ok" if ratios[key] <= TARGETS[key] else "MISSED")
    text += "\n\ntargets\n" + format_table(verdicts, ["measure", "measured", "target", "verdict"])
    return text, ratios


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=float, default=1e8, help="parameters of the MLP")
    p.add_argument("--repeats", type=int, default=7, help="interleaved repeats of each save and load")
    p.add_argument("--train-repeats", type=int, default=3, help="interleaved repeats of each training run")
    p.add_argument("--steps", type=int, default=9, help="training steps per run of the stall measurement")
    p.add_argument("--save-every", type=int, default=3, help="steps between saves in those runs")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default); see overhead.py")
    p.add_argument("--dir", default=None, help="folder for the files (default: a temp folder on the repo's disk)")
    p.add_argument("--json", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one measurement in a fresh process
    p.add_argument("--path", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine_info(torch.device("cpu"))
    print(header(info))
    trainer = Trainer(args.params)
    state = trainer.state()
    result = {"name": trainer.name, "params": count_parameters(trainer.model), "state_bytes": state_bytes(state),
              "repeats": args.repeats, "train_repeats": args.train_repeats, "steps": args.steps,
              "save_every": args.save_every}
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-", dir=args.dir or REPO) as tmp:
        tmp = Path(tmp)
        print(f"{trainer.name}: {result['params'] / 1e6:.1f} M parameters")
        result["save"] = bench_save(state, tmp, args.repeats, print)
        result["file_bytes"] = max(p.stat().st_size for p in (tmp / "managed").glob("step_*.pt"))
        shutil.rmtree(tmp / "managed")  # free the disk and the page cache for the next part
        result["load"] = bench_load(state, tmp, args, print)
        shutil.rmtree(tmp / "load")
        result["memory"] = bench_memory(tmp, args, print)
        del state
        result["training"] = bench_training(trainer, tmp, args, print)
    result["load_avg_1m_at_end"] = os.getloadavg()[0]  # a shared machine: what ran beside the bench
    text, ratios = report(result)
    passed = all(ratios[k] <= TARGETS[k] for k in TARGETS)
    print()
    print(text)
    path = write_json("checkpoint_cost", {"machine": info, "results": result, "ratios": ratios, "targets": TARGETS,
                                          "passed": passed, "table": text}, args.json)
    print(f"\nJSON: {path}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
