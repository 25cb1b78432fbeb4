"""Reproducibility: seed every RNG, switch on determinism, capture RNG state, dump the run config.

Pitfalls this module handles:
- Four generators, not one: python ``random``, numpy's global RNG, torch CPU and every
  CUDA device. Missing one (say numpy, used by an augmentation) makes two "identical"
  runs differ.
- ``np.random.get_state()`` is not loadable with ``torch.load(weights_only=True)``;
  ``rng_state()`` stores it as a tensor.
- cuDNN's ``deterministic`` flag restricts its algorithm search to deterministic
  algorithms with or without ``benchmark``; ``benchmark=True`` may still pick a different
  (deterministic) algorithm in each run, so bitwise repeats need it off too.
- ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` was a requirement of older torch versions: they raised
  under ``use_deterministic_algorithms`` for a cuBLAS matmul unless it was set before the first
  cuBLAS call. The pinned torch (2.14.1) gives every cuBLAS handle and stream its own workspace and
  no longer checks it (its docstring of ``use_deterministic_algorithms`` no longer mentions it); the
  variable now only sizes that workspace, so setting it is harmless.
- ``config.json`` is the run's identity: ``dump_run_config`` writes it atomically and durably
  (``runfolder.write_config``, its only writer), so a start killed mid-write leaves the old file
  or the whole new one.

Example::

    set_seed(0)
    state = rng_state()       # put it into the checkpoint
    set_rng_state(state)      # on resume: every generator continues where it was

Taught in ``05_reproducibility`` §1 (``set_seed``), §3 (config + git commit) and §4 (``set_deterministic``);
``rng_state`` / ``set_rng_state`` are what ``course_utils.checkpoint`` saves and restores (04 §2).
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from course_utils.runfolder import RunFiles, write_config

__all__ = ["set_seed", "set_deterministic", "rng_state", "set_rng_state", "git_commit", "run_config",
           "dump_run_config"]


def set_seed(seed: int) -> None:
    """Seed python ``random``, numpy, torch (CPU) and all CUDA devices."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)           # also seeds every CUDA device
    torch.cuda.manual_seed_all(seed)  # explicit, and harmless without a GPU


def set_deterministic(enabled: bool = True, warn_only: bool = False) -> None:
    """Ask torch for deterministic kernels (on a GPU possibly slower: measure it there).

    Sets ``cudnn.deterministic`` (cuDNN then chooses among deterministic
    algorithms only, benchmarking or not), ``cudnn.benchmark = False`` (autotuning times
    the candidates and may pick a different algorithm in each run, so results can differ
    in the last bits) and ``torch.use_deterministic_algorithms``. An op with no
    deterministic kernel (e.g. some CUDA losses and poolings) raises, or only warns with
    ``warn_only=True``. ``enabled=False`` leaves ``cudnn.benchmark`` as it is: restore
    your own value if you had turned it on. It also sets ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
    unless already set: older torch versions required it for deterministic
    cuBLAS (set before the first cuBLAS call); torch 2.14.1 does not, and there it only sizes
    each handle's workspace.

    Example::

        set_deterministic(True)    # before building the model
        ...
        set_deterministic(False)   # switch it off again; restore cudnn.benchmark yourself
    """
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # older torch required it; harmless now
        torch.backends.cudnn.benchmark = False  # autotuning picks kernels by timing, which defeats determinism
    torch.backends.cudnn.deterministic = enabled
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def rng_state() -> dict[str, Any]:
    """The state of all four generators, in a form ``torch.load(weights_only=True)`` accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured. Raises if the CUDA device count differs."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda:
        if len(cuda) != torch.cuda.device_count():
            raise RuntimeError(f"检查点保存了 {len(cuda)} 个 CUDA 设备的随机数状态,当前有 {torch.cuda.device_count()} 个")
        torch.cuda.set_rng_state_all(cuda)


def git_commit(path: str | os.PathLike = ".") -> tuple[str, bool | str]:
    """``(commit hash, dirty)`` of the git work tree holding ``path``; ``("unknown", "unknown")`` outside git."""
    try:
        run = lambda *args: subprocess.run(["git", *args], cwd=path, capture_output=True, text=True,  # noqa: E731
                                           timeout=10, check=True).stdout.strip()
        commit = run("rev-parse", "HEAD")
        dirty = bool(run("status", "--porcelain", "--untracked-files=no"))
        return commit, dirty
    except (OSError, subprocess.SubprocessError):
        return "unknown", "unknown"


def run_config(hparams: dict[str, Any], device: torch.device | str | None = None,
               repo: str | os.PathLike | None = None) -> dict[str, Any]:
    """Every hyperparameter plus what is needed to trace the run three months later."""
    commit, dirty = git_commit(repo if repo is not None else Path.cwd())
    return {
        "hparams": {k: (str(v) if isinstance(v, Path) else v) for k, v in hparams.items()},
        "git_commit": commit,
        "git_dirty": dirty,
        "torch": str(torch.__version__),  # TorchVersion is not loadable with weights_only=True
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "device": str(device) if device is not None else None,
        "python": platform.python_version(),
        "command": " ".join([sys.executable, *sys.argv]),
        "started_at": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def dump_run_config(out_dir: str | os.PathLike | RunFiles, hparams: dict[str, Any],
                    device: torch.device | str | None = None, repo: str | os.PathLike | None = None) -> dict[str, Any]:
    """Write ``run_config(...)`` to the run folder's ``config.json`` (``runfolder.write_config``) and return it.

    ``out_dir``: the folder, or its ``runfolder.RunFiles`` map (``RunFolder.files``).
    """
    config = run_config(hparams, device, repo)
    write_config(out_dir, config)
    return config
