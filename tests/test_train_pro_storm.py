"""Kill storm (issue 14, item 9): SIGKILL at any moment loses no metrics record that a checkpoint covers.

The report: a run killed three times on a machine loaded ~15 on 2 cores (some kills during
start-up or the first steps; 2 workers; a checkpoint every 5 steps) ended with 11 of its 21
step records. The window found: two trainer processes in one folder. The later one rewrites
``metrics.jsonl`` (temp file + ``os.replace``) while the earlier one keeps appending to the
replaced, unlinked file and keeps saving checkpoints that cover those lost records; a restart
then resumes from the earlier one's newest checkpoint, past a gap in the metrics. A process
that is slow to die, or a second start, is enough. The run-folder lock closes it (a second
trainer is refused); the rewrite is atomic and durable, the copy of the metrics kept with
set-aside checkpoints is made before they move, and every record is flushed before the
checkpoint that covers it is written.

Here two chains run side by side (load), each killed at chosen moments: during start-up,
just after the metrics rewrite of a resume, at the first flush after it, during and just
after a checkpoint save, and at random.
After every kill, every step up to the newest valid checkpoint must be in ``metrics.jsonl``
exactly once, with the uninterrupted run's loss (the session's shared ``reference``: same
trajectory, other free flags); at the end the whole run must equal it.
"""
from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest

from tests.support.pro_runs import TINY, newest_checkpoint, run_all, start, train_losses

pytestmark = pytest.mark.slow
# 2 epochs of 15 steps; 2 DataLoader workers; a checkpoint every 5 steps; a flush every 3
ARGS = [*TINY, "--epochs", "2", "--ckpt-every-steps", "5", "--log-every", "3", "--workers", "2"]
# When each chain's trainer is killed, in order. The first kill comes after a save, so every later start
# resumes from a checkpoint (a real rewrite of metrics.jsonl, a real first flush after it).
PLAN = {"a": ("after a save", "after the rewrite", "during a save", "first flush", "start-up"),
        "b": ("after a save", "random", "start-up", "during a save", "after the rewrite")}


def trigger(strategy: str, out: Path, proc, resumed_from: int, rng: random.Random):
    """A predicate that says when to kill ``proc`` for ``strategy``."""
    metrics = out / "metrics.jsonl"
    inode = metrics.stat().st_ino if metrics.exists() else None
    t0, delay = time.monotonic(), rng.uniform(0.05, 3.0)
    claimed = lambda: (out / "run.lock").exists() and f"pid {proc.pid} @" in (out / "run.lock").read_text()  # noqa: E731
    rewritten = lambda: metrics.exists() and metrics.stat().st_ino != inode  # noqa: E731

    def saved(complete: bool) -> bool:  # a newer checkpoint: its temp file, its file, or its checksum too
        names = [p.name for p in (out / "checkpoints").iterdir()] if (out / "checkpoints").exists() else []
        newer = [n for n in names if n.startswith("step_") and int(n[5:13]) > resumed_from]
        if complete:
            return any(n.endswith(".sha256") for n in newer)
        return bool(newer) or any(n.startswith(".step_") for n in names)
    if strategy == "start-up":
        return lambda: claimed() and time.monotonic() - t0 > delay / 6
    if strategy == "after the rewrite":
        return rewritten
    if strategy == "first flush":
        return lambda: rewritten() and any(step > resumed_from for step, _ in train_losses(out))
    if strategy == "during a save":
        return lambda: saved(complete=False)
    if strategy == "after a save":
        return lambda: saved(complete=True)
    return lambda: time.monotonic() - t0 > delay


def test_kill_storm_loses_no_covered_record(reference, tmp_path):
    chains = {name: tmp_path / name for name in ("a", "b")}
    rngs = {"a": random.Random(1), "b": random.Random(2)}
    expected = dict(train_losses(reference))
    history = {name: [] for name in chains}
    for k in range(len(PLAN["a"])):
        procs, pending = {}, {}
        for name, out in chains.items():
            resumed_from = newest_checkpoint(out)
            procs[name] = start(out, *ARGS, *(["--resume"] if k else []), interpreter="forked")
            strategy = PLAN[name][k]
            pending[name] = (strategy, trigger(strategy, out, procs[name], resumed_from, rngs[name]))
        deadline = time.monotonic() + 240
        while pending:
            for name, (strategy, fire) in list(pending.items()):
                if procs[name].poll() is not None or fire():
                    procs[name].send_signal(signal.SIGKILL)  # the trainer only: its workers are orphaned
                    procs[name].wait()
                    history[name].append((strategy, newest_checkpoint(chains[name])))
                    del pending[name]
            assert time.monotonic() < deadline, f"stuck: {pending}"
            time.sleep(0.002)
        for name, out in chains.items():  # the invariant, after every kill
            covered = newest_checkpoint(out)
            records = train_losses(out)
            steps = [step for step, _ in records]
            assert len(steps) == len(set(steps)), f"{name}: a step logged twice after {history[name]}"
            missing = [s for s in range(1, covered + 1) if s not in steps]
            assert not missing, f"{name}: checkpoint {covered} covers lost records {missing}; kills {history[name]}"
            assert all(loss == expected[step] for step, loss in records if step <= covered), name
    results = run_all([(out, [*ARGS, "--resume"]) for out in chains.values()], interpreter="forked")
    for (code, output), (name, out) in zip(results, chains.items()):
        assert code == 0, output
        assert train_losses(out) == train_losses(reference), f"{name}: kills {history[name]}"
    assert all(covered > 0 for _, covered in history["a"] + history["b"]), f"a kill before any save: {history}"
