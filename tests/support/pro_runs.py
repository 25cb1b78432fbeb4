"""Running solutions/homework/train_cifar_pro.py from the tests (tests/test_train_pro*.py).

Runs are tiny: TinyCNN of width 8 on 10% of the COURSE_FAST data, batch 32 -> 15 steps per
epoch. Independent runs start side by side (``run_all``); the machine has 2 cores.

One uninterrupted run per configuration and test session, shared by every test file and xdist
worker: ``reference`` (``REFERENCE``, 2 epochs) and ``reference_3_epochs`` (``REFERENCE_3_EPOCHS``).
Killed, stopped or restarted runs of the same trajectory compare their losses with it: flags that
are free fields of the run's identity (``--workers``, ``--log-every``, ``--ckpt-every-steps``,
``--async-ckpt``) do not change the losses.
"""
from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import pytest

from course_utils import interrupt
from course_utils.checkpoint import CheckpointManager
from course_utils.data import CIFAR_FOLDER
from course_utils.monitor import read_metrics
from tests.support.forkserver import shared_server
from tests.support.notebook_cells import ROOT

SCRIPT = ROOT / "solutions" / "homework" / "train_cifar_pro.py"
STEPS_PER_EPOCH = 15  # 500 training images (COURSE_FAST, --data-fraction 0.1) // batch 32
TINY = ["--model", "tiny", "--width", "8", "--data-fraction", "0.1", "--batch-size", "32", "--warmup-steps", "5",
        "--lr", "3e-3", "--no-progress"]
REFERENCE = [*TINY, "--epochs", "2", "--ckpt-every-steps", "4", "--log-every", "3"]
REFERENCE_STEPS = 2 * STEPS_PER_EPOCH  # checkpoints at 4, 8, ..., 28, the epoch ends (15: eval + best) and 30
REFERENCE_3_EPOCHS = [*TINY, "--epochs", "3", "--ckpt-every-steps", "4", "--log-every", "3", "--workers", "2"]


def command(out: Path, *args: str, kill_after: int | None = None) -> list[str]:
    """``python SCRIPT --out OUT ARGS``; ``kill_after``: through ``course_utils.interrupt``, which SIGKILLs the run
    right after its ``kill_after``-th optimizer step (counted in the process: the same step at any load)."""
    launch = [str(SCRIPT)] if kill_after is None else [interrupt.__file__, str(kill_after), str(SCRIPT)]
    return [sys.executable, *launch, "--out", str(out), *args]


Interpreter = Literal["forked", "fresh"]


def start(out: Path, *args: str, interpreter: Interpreter, env: dict | None = None, kill_after: int | None = None,
          **popen: Any) -> subprocess.Popen:
    """Start the script (``kill_after``: see :func:`command`); stdout and stderr together in ``proc.stdout`` (text).

    ``interpreter``, said at every call (tests/README.md): "forked" from the fork server (``tests/support/forkserver.py``:
    torch already imported, so the script's own start-up is not exercised), or "fresh", a real interpreter
    (start-up, imports, an ``env`` or ``popen`` options of its own). A forked run takes neither ``env`` nor a
    ``popen`` option other than ``start_new_session``, and a server that cannot fork fails the test: never a
    silent fresh start.
    """
    argv = command(out, *args, kill_after=kill_after)
    if interpreter == "fresh":
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, **popen)
    if interpreter != "forked" or env is not None or not set(popen) <= {"start_new_session"}:
        raise ValueError(f"interpreter={interpreter!r}, env, popen {sorted(popen)}: a forked run inherits this "
                         "process's environment; ask for interpreter='fresh'")
    server = shared_server(SCRIPT)
    forked = server.start(argv[2:], script=argv[1], new_session=popen.get("start_new_session", False))
    if forked is None:
        raise RuntimeError(f"the fork server cannot fork ({server.error}): fix it, or ask for interpreter='fresh'")
    return forked


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"the run did not end within {timeout} s:\n{output[-3000:]}")
    return proc.returncode, output


def run(out: Path, *args: str, interpreter: Interpreter, timeout: float = 300,
        env: dict | None = None) -> tuple[int, str]:
    return finish(start(out, *args, interpreter=interpreter, env=env), timeout)


def run_all(jobs: list[tuple[Path, list[str]]], *, interpreter: Interpreter,
            timeout: float = 300) -> list[tuple[int, str]]:
    """Start every ``(out, args)`` job at once, then wait for all: (returncode, output) each."""
    procs = [start(out, *args, interpreter=interpreter) for out, args in jobs]
    return [finish(p, timeout) for p in procs]


def train_records(out: Path) -> list[dict]:
    return [r for r in read_metrics(out / "metrics.jsonl") if r.get("split") == "train"]


def train_losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in train_records(out)]


def last_step(out: Path) -> int:
    records = train_records(out)
    return records[-1]["step"] if records else 0


def newest_checkpoint(out: Path) -> int:
    """The step of the newest checkpoint in ``out/checkpoints`` that passes its checksum (0: none)."""
    if not (out / "checkpoints").exists():
        return 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = CheckpointManager(out / "checkpoints").load_latest()
    return found.state["step"] if found else 0


def wait_for_step(proc: subprocess.Popen, out: Path, step: int, timeout: float = 180) -> int:
    """Poll ``metrics.jsonl`` until it holds ``step``; the step seen (the run may be further)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = last_step(out)
        if seen >= step:
            return seen
        if proc.poll() is not None:
            pytest.fail(f"the run ended before step {step}: {proc.stdout.read()}")
        time.sleep(0.02)
    pytest.fail(f"step {step} not reached in {timeout} s")


def status(out: Path) -> dict:
    return json.loads((out / "status.json").read_text(encoding="utf-8"))


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file of the run under ``folder``: relative path -> (size, mtime_ns); to prove nothing changed.
    ``run.lock`` is left out: any process that claims the folder, even one refused later, writes its pid there."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "run.lock"}


def shared_run(tmp_path_factory: pytest.TempPathFactory, name: str, args: list[str],
               launch: Callable[..., subprocess.Popen] | None = None) -> Path:
    """The finished, uninterrupted run of ``args`` in the session's folder ``name``: the first xdist worker to ask
    makes it under a lock, the others wait and reuse it. Read it; copy it before running in it. ``launch(out,
    *args)`` starts it another way (torchrun: ``tests/support/torchrun_jobs.shared_job``); by default a fresh interpreter."""
    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root  # the folder all workers share
    out = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            proc = launch(out, *args) if launch else start(out, *args, interpreter="fresh")  # start-up included
            code, output = finish(proc)
            assert code == 0, output
    assert status(out)["state"] == "finished", f"the shared run {name} failed: see the test that made it"
    return out


def load_script():
    """The script as a module (no training: its ``__main__`` blocks do not run)."""
    spec = importlib.util.spec_from_file_location("train_cifar_pro_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def poisoned_torch(folder: Path) -> dict[str, str]:
    """An environment in which ``import torch`` fails loudly: a run that imports torch shows it."""
    fake = folder / "poison" / "torch"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("raise SystemExit('TORCH WAS IMPORTED')\n")
    return {**os.environ, "PYTHONPATH": str(folder / "poison")}


def fake_cifar(root: Path, truncate: str | None = None) -> Path:
    """A tiny real-format CIFAR-10 folder (4 images per train batch, 3 test images); ``truncate`` cuts a file."""
    import pickle
    folder = root / CIFAR_FOLDER
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, n in [(f"data_batch_{i}", 4) for i in range(1, 6)] + [("test_batch", 3)]:
        batch = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "labels": rng.integers(0, 10, n).tolist()}
        payload = pickle.dumps(batch)
        (folder / name).write_bytes(payload[: len(payload) // 2] if name == truncate else payload)
    return folder
