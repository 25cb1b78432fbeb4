"""Where the workbook runs: device choice, an environment table, and the size switch.

``COURSE_FAST=1`` shrinks data sets and step counts so that tests and CPU-only
learners finish quickly. Only sizes change; the code path stays the same.

Example::

    from course_utils.env import pick_device, by_size
    device = pick_device()              # cuda, then mps, then cpu
    steps = by_size(full=2000, fast=60)

Taught in ``00_start_here`` §1 (the environment table) and every notebook's first cell.
"""
from __future__ import annotations

import os
import platform
from typing import TypeVar

import torch

__all__ = ["is_fast", "by_size", "pick_device", "usable_cores", "configure_cpu_threads", "device_name", "supports_bf16",
           "cpu_bf16_instructions", "environment_rows", "environment_table"]


T = TypeVar("T")


def is_fast() -> bool:
    """True when ``COURSE_FAST`` is set to a true value (1, true, yes)."""
    return os.environ.get("COURSE_FAST", "").strip().lower() in {"1", "true", "yes", "on"}


def by_size(full: T, fast: T) -> T:
    """Return ``fast`` under ``COURSE_FAST=1``, otherwise ``full``."""
    return fast if is_fast() else full


def pick_device(prefer: str = "auto") -> torch.device:
    """Choose the device: ``auto`` tries cuda, then mps, then cpu.

    ``prefer`` may also name a device ("cpu", "cuda", "cuda:1", "mps"); asking for
    one that is not there raises a clear error instead of silently using the CPU.
    """
    prefer = (prefer or "auto").lower()
    if prefer == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(prefer)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"要求使用 {prefer},但这台机器没有可用的 CUDA GPU;请改用 --device auto 或 cpu。")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise RuntimeError(f"要求使用 {prefer},但 MPS 不可用;请改用 --device auto 或 cpu。")
    return device


def usable_cores() -> int:
    """CPU cores this process may run on (the affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def configure_cpu_threads(device: torch.device | None = None) -> int:
    """Set torch's CPU threads to the workbook's policy and return the number used.

    Policy: one core left free (``usable_cores() - 1``, at least 1), unless the user chose
    with ``OMP_NUM_THREADS``. Why: torch's OpenMP threads wait for each other at every op,
    so when another process (the notebook server, DataLoader workers, a second kernel) takes
    a core, a run with one thread per core stalls. Measured on 2 cores (``bench/threads.py``,
    ``bench/RESULTS.md`` §9): quiet, 2 threads took 0.54x the time of 1 thread; with one core
    busy, 1.6x. The policy trades the quiet machine's speed-up for never collapsing.
    Pitfall: on a machine you have to yourself, ``OMP_NUM_THREADS=<cores>`` is faster.
    On a GPU the CPU threads matter little and are left alone.
    """
    device = device or pick_device()
    if device.type != "cpu":
        return torch.get_num_threads()
    chosen = os.environ.get("OMP_NUM_THREADS", "").strip()
    threads = int(chosen) if chosen.isdigit() and int(chosen) > 0 else max(1, usable_cores() - 1)
    torch.set_num_threads(threads)
    return threads


def device_name(device: torch.device) -> str:
    """A human-readable name: the GPU model, or the CPU's architecture."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple GPU (MPS)"
    return f"CPU ({platform.machine() or 'unknown'})"


def supports_bf16(device: torch.device) -> bool:
    """Whether bf16 autocast is worth using on this device."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return True  # supported by autocast; speed depends on the CPU (AVX512-BF16/AMX)
    return device.type == "mps"


def cpu_bf16_instructions() -> bool | None:
    """Whether this CPU has bf16 matrix instructions (AVX512-BF16 or AMX-BF16); None if unknown.

    Why: bf16 autocast on a CPU can only beat fp32 with them; without them every op pays the
    casts and computes at fp32 speed. Read from ``/proc/cpuinfo`` (Linux); elsewhere unknown.
    Pitfall: having them does not make autocast faster for every model: measure (``01_amp`` §6).
    """
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return None
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def environment_rows(device: torch.device | None = None) -> list[tuple[str, str]]:
    """The rows of the environment table shown in the first notebook."""
    device = device or pick_device()
    rows = [
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("device", f"{device.type} · {device_name(device)}"),
        ("bf16 autocast", "yes" if supports_bf16(device) else "no"),
        ("CPU threads (torch)", str(torch.get_num_threads())),
        ("COURSE_FAST", "on (small sizes)" if is_fast() else "off (full sizes)"),
    ]
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        rows.insert(3, ("CUDA capability", f"{major}.{minor} · {total:.0f} GiB"))
        rows.insert(4, ("CUDA runtime", str(torch.version.cuda)))
    return rows


def environment_table(device: torch.device | None = None) -> str:
    """The environment table as aligned text."""
    rows = environment_rows(device)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
