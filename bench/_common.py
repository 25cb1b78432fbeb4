"""Shared helpers for the benchmark scripts: machine info, robust statistics, tables, JSON output.

Benchmarks are not tests: they print a table and write ``bench/results/<name>.json``.
Every number comes from the run that printed it; nothing is hard-coded.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"

if str(REPO) not in sys.path:  # course_utils importable without an editable install, too
    sys.path.insert(0, str(REPO))


PRO_SCRIPT = REPO / "solutions" / "homework" / "train_cifar_pro.py"


def load_pro_script() -> Any:
    """The professional script as a module (its ``train_step`` is what the benches measure).

    Loaded from its file, not copied: a bench must time the real code.
    """
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_cifar_pro", PRO_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def cpu_model() -> str:
    """``lscpu``'s model name (falls back to /proc/cpuinfo, then platform)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: Any = None) -> dict[str, Any]:
    """Where and when the numbers were measured (goes into every JSON file and table header)."""
    import torch

    from course_utils.env import cpu_bf16_instructions

    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_bf16_instructions": cpu_bf16_instructions(),
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "command": " ".join([Path(sys.executable).name, *[_rel(a) for a in sys.argv]]),
    }
    if device is not None:
        info["device"] = str(device)
        if getattr(device, "type", str(device)) == "cuda":
            info["gpu"] = torch.cuda.get_device_name(device)
            info["cuda"] = torch.version.cuda
    return info


def _rel(arg: str) -> str:
    try:
        return str(Path(arg).resolve().relative_to(REPO)) if os.path.exists(arg) else arg
    except ValueError:
        return arg


def header(info: dict[str, Any]) -> str:
    dev = info.get("device", "cpu")
    extra = f" · {info['gpu']}" if "gpu" in info else ""
    return (f"# {info['command']}\n# {info['date']} · {info['cpu_model']} · {info['cpu_count']} CPU cores · "
            f"torch {info['torch']} ({info['torch_threads']} threads) · device {dev}{extra} · "
            f"load avg at start {info['load_avg_1m_at_start']}")


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def spread(xs: Sequence[float]) -> dict[str, float]:
    """Median, min, max and interquartile range (robust to the noise of a shared machine)."""
    xs = sorted(xs)
    if len(xs) >= 4:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    else:
        q1, q3 = xs[0], xs[-1]
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "q1": q1, "q3": q3, "n": len(xs)}


def format_table(rows: Iterable[Sequence[Any]], headers: Sequence[str]) -> str:
    """A GitHub-markdown table (readable in a terminal too)."""
    rows = [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 1) + ":" if i else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(list(headers)), sep, *(line(r) for r in rows)])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != v:
            return "nan"
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 100:
            return f"{v:,.0f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 0.01:
            return f"{v:.3f}"
        return f"{v:.2e}"
    return str(v)


def write_json(name: str, payload: dict[str, Any], path: str | os.PathLike | None = None) -> Path:
    """Write ``payload`` to ``path`` or ``bench/results/<name>.json``; return the path."""
    out = Path(path) if path else RESULTS_DIR / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    return out


def rss_mb() -> float:
    """Current resident set size of this process (Linux: /proc/self/statm)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        import psutil
        return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (monotonic: a weak proxy for training memory)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 2**20)
