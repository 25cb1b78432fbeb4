"""Data parallel on the CPU: the professional script under torchrun with 2 processes, next to the ideal.

Runs solutions/homework/train_cifar_pro.py unmodified (COURSE_FAST=1 data, SmallCNN of width 32,
no checkpoint until the end), interleaved, ``--repeats`` times:

- 1 process x 1 thread:   ``python train_cifar_pro.py --batch-size B``  (``OMP_NUM_THREADS=1``)
- 2 processes x 1 thread: ``torchrun --standalone --nproc-per-node 2 train_cifar_pro.py --batch-size 2B``
  (B per process: each process does the work of the single one)
- 1 process x 2 threads:  ``python train_cifar_pro.py --batch-size 2B`` (``OMP_NUM_THREADS=2``): the
  other way to use both cores

The ideal for 2 processes is twice the throughput of one process with one thread. What separates
them: the gradient all-reduce (gloo over loopback) and the script's small per-step agreements
(global loss, stop flag, rank 0's decisions), waiting for the slower rank at each all-reduce, and two
processes sharing the memory bandwidth and the machine with everything else running on it.
Throughput is the script's own ``samples_per_sec`` (global samples per second of training time;
evaluation, checkpoints and the first flush window excluded), median over the windows of a run.

    python bench/ddp.py                          # ~3 minutes on 2 cores
    python bench/ddp.py --steps 40 --repeats 2   # quicker
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PRO_SCRIPT, REPO, format_table, header, machine_info, spread, write_json  # noqa: E402

from course_tools.noninteractive import quiet_environ  # noqa: E402
from course_utils.monitor import read_metrics  # noqa: E402

ARMS = {  # name: (processes, threads per process, global batch as a multiple of --batch)
    "1 process x 1 thread": (1, 1, 1),
    "2 processes x 1 thread": (2, 1, 2),
    "1 process x 2 threads": (1, 2, 2),
}


def throughput(processes: int, threads: int, batch: int, steps: int, log_every: int, folder: Path) -> float:
    """Median samples/s of one run of the script (its metrics windows after the first)."""
    out = folder / f"p{processes}t{threads}"
    env = quiet_environ({**os.environ, "OMP_NUM_THREADS": str(threads)}, override=True)
    launcher = [sys.executable] if processes == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    cmd = [*launcher, str(PRO_SCRIPT), "--out", str(out), "--overwrite", "--model", "small", "--width", "32",
           "--batch-size", str(batch), "--epochs", "10", "--max-steps", str(steps), "--log-every", str(log_every),
           "--ckpt-every-steps", "0", "--ckpt-every-seconds", "0", "--no-progress"]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    windows = sorted({r["step"] // log_every: r["samples_per_sec"] for r in read_metrics(out / "metrics.jsonl")
                      if r["split"] == "train" and r["samples_per_sec"]}.items())
    return statistics.median(sps for _, sps in windows[1:])  # the first window holds warm-up steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64, help="samples per process and step")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--log-every", type=int, default=10, help="steps per throughput window")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    info = machine_info("cpu")
    info["torch_threads"] = "1 or 2 (per arm)"
    print(header(info))
    runs: dict[str, list[float]] = {name: [] for name in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name in (list(ARMS) if r % 2 == 0 else list(reversed(ARMS))):  # alternate: drift hits all arms
                processes, threads, multiple = ARMS[name]
                runs[name].append(throughput(processes, threads, args.batch * multiple, args.steps, args.log_every,
                                             Path(tmp)))
                print(f"repeat {r + 1}: {name}: {runs[name][-1]:.0f} samples/s", flush=True)
    stats = {name: spread(v) for name, v in runs.items()}
    one = stats["1 process x 1 thread"]["median"]
    ideal = 2 * one
    rows = [[name, f"{s['median']:.0f} ({s['min']:.0f}-{s['max']:.0f})", s["median"] / one, s["median"] / ideal]
            for name, s in stats.items()]
    rows.append(["ideal for 2 processes (2 x 1 process x 1 thread)", f"{ideal:.0f}", 2.0, 1.0])
    text = (f"SmallCNN (width 32), {args.batch} samples per process and step, {args.steps} steps per run, "
            f"{args.repeats} interleaved repeats; samples/s of the global batch, median over the run's windows\n\n"
            + format_table(rows, ["arm", "samples/s (median, min-max)", "x 1 process x 1 thread", "x ideal"]))
    print()
    print(text)
    two = stats["2 processes x 1 thread"]["median"]
    threads = stats["1 process x 2 threads"]["median"]
    path = write_json("ddp", {"machine": info, "batch_per_process": args.batch, "steps": args.steps,
                              "repeats": args.repeats, "samples_per_sec": runs, "efficiency": two / ideal,
                              "speedup_2_processes": two / one, "speedup_2_threads": threads / one, "table": text},
                      args.json)
    print(f"\n2 processes reach {100 * two / ideal:.0f}% of the ideal ({two / one:.2f}x one process); "
          f"2 threads in one process: {threads / one:.2f}x.\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
