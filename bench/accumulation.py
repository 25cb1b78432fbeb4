"""Gradient accumulation: memory and throughput per K, the professional script itself.

Runs solutions/homework/train_cifar_pro.py unmodified (COURSE_FAST=1 data, SmallCNN of width 32, one
process, no checkpoint until the end) with the same global batch and ``--accum-steps K`` for each K,
interleaved (the order reversed every repeat), ``--repeats`` times. Each run is a fresh process, so its
peak memory is its own: the script's ``mem_peak_mb`` (the process's peak RSS on a CPU, the CUDA
allocator's peak on a GPU) at its last step, and its ``samples_per_sec`` (median over the windows after
the first, evaluation excluded).

What to expect: K micro-batches hold the activations of one micro-batch at a time, so the part of the
peak that grows with the batch shrinks about K-fold; the rest (the interpreter, torch, the data in
memory) does not. Throughput falls when a micro-batch becomes too small to keep the cores busy.

    python bench/accumulation.py                     # ~3 minutes on 2 cores
    python bench/accumulation.py --ks 1,4 --repeats 1
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


def one_run(k: int, batch: int, steps: int, log_every: int, threads: int, folder: Path) -> tuple[float, float]:
    """(peak memory in MiB, median samples/s) of one run of the script with ``--accum-steps k``."""
    out = folder / f"k{k}"
    env = quiet_environ({**os.environ, "OMP_NUM_THREADS": str(threads)}, override=True)
    cmd = [sys.executable, str(PRO_SCRIPT), "--out", str(out), "--overwrite", "--model", "small", "--width", "32",
           "--batch-size", str(batch), "--accum-steps", str(k), "--epochs", "10", "--max-steps", str(steps),
           "--log-every", str(log_every), "--ckpt-every-steps", "0", "--ckpt-every-seconds", "0", "--no-progress"]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    train = [r for r in read_metrics(out / "metrics.jsonl") if r["split"] == "train"]
    windows = [r["samples_per_sec"] for r in train if r["samples_per_sec"]][1:]  # the first holds warm-up steps
    return train[-1]["mem_peak_mb"], statistics.median(windows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ks", default="1,2,4,8", help="the K values to compare")
    p.add_argument("--batch", type=int, default=512, help="the global batch (the same for every K)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--log-every", type=int, default=3, help="steps per throughput window")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    info = machine_info("cpu")
    info["torch_threads"] = args.threads
    print(header(info))
    runs: dict[int, list[tuple[float, float]]] = {k: [] for k in ks}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for k in (ks if r % 2 == 0 else list(reversed(ks))):  # alternate: drift hits every K alike
                runs[k].append(one_run(k, args.batch, args.steps, args.log_every, args.threads, Path(tmp)))
                print(f"repeat {r + 1}: K={k}: peak {runs[k][-1][0]:.0f} MiB, {runs[k][-1][1]:.0f} samples/s",
                      flush=True)
    mem = {k: spread([m for m, _ in v]) for k, v in runs.items()}
    sps = {k: spread([s for _, s in v]) for k, v in runs.items()}
    base_mem, base_sps = mem[ks[0]]["median"], sps[ks[0]]["median"]
    rows = [[k, args.batch // k, f"{mem[k]['median']:.0f}", mem[k]["median"] / base_mem,
             f"{sps[k]['median']:.0f} ({sps[k]['min']:.0f}-{sps[k]['max']:.0f})", sps[k]["median"] / base_sps]
            for k in ks]
    text = (f"SmallCNN (width 32), global batch {args.batch}, {args.steps} steps per run, {args.threads} threads, "
            f"{args.repeats} interleaved repeats; one fresh process per run\n\n"
            + format_table(rows, ["K", "micro-batch", "peak MiB (median)", f"x K={ks[0]}",
                                  "samples/s (median, min-max)", f"x K={ks[0]}"]))
    print()
    print(text)
    path = write_json("accumulation", {"machine": info, "batch": args.batch, "steps": args.steps,
                                       "repeats": args.repeats, "runs": {str(k): v for k, v in runs.items()},
                                       "table": text}, args.json)
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
