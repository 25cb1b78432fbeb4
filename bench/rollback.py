"""Rollback on a loss spike (issue 22): what ``--on-spike rollback`` costs and what it saves, on the CPU.

Runs solutions/homework/train_cifar_pro.py as subprocesses (COURSE_FAST=1 data, TinyCNN, batch 32,
one torch thread), each run once (one seed: a measurement of this machine, not a verdict over seeds):

- unspiked:  the plain run;
- rollback:  the same run with a corrupted stretch of global batches (``--inject-bad-batch``: NaN
  images) and ``--on-spike rollback``: back to last_good.pt in the same process, the batches from
  there to the bad ones + ``--skip-batches`` skipped;
- stop + manual resume: the same spikes with ``--on-spike stop`` (exit code 3), then what a person
  does without rollback: ``--resume`` (from last_good.pt, as the script does after that stop) with
  ``--max-bad-steps`` raised to the window, so that the run trains through the bad batches (their
  steps skipped by the non-finite guard, as the README's bad-step section describes).

Measured: the rollback's wall time (the ``seconds`` of its ``metrics.jsonl`` event: reload, files set
aside, metrics cut back, the rollback's checkpoint, the records) against one ``load_verified`` of
last_good.pt in this process (median of 5); the fraction of the data skipped (``SKIPPED_FILE``); the
final eval loss and accuracy (EMA weights) of the three arms, and their wall times.

    python bench/rollback.py
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PRO_SCRIPT, format_table, header, machine_info, spread, write_json  # noqa: E402

from course_tools.noninteractive import quiet_environ  # noqa: E402
from course_utils.monitor import read_metrics  # noqa: E402
from course_utils.rollback import SKIPPED_FILE  # noqa: E402


def train(out: Path, args: list[str], env: dict) -> tuple[int, float, str]:
    """One run of the script: exit code, wall seconds, output."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(PRO_SCRIPT), "--out", str(out), *args], env=env,
                          capture_output=True, text=True, timeout=1800)
    return proc.returncode, time.perf_counter() - start, proc.stdout + proc.stderr


def final_eval(out: Path) -> dict:
    return [r for r in read_metrics(out / "metrics.jsonl") if r.get("split") == "val"][-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--data-fraction", default="0.2", help="of COURSE_FAST's 5000 images: 1000, 31 batches of 32")
    p.add_argument("--bad", default="40,41,42", help="global batch positions made NaN")
    p.add_argument("--skip-batches", default="10")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    env = {**quiet_environ(override=True), "OMP_NUM_THREADS": "1"}
    import torch
    torch.set_num_threads(1)
    from course_utils.checkpoint import load_verified
    info = machine_info(torch.device("cpu"))
    print(header(info))
    base = ["--model", "tiny", "--width", "16", "--batch-size", "32", "--data-fraction", args.data_fraction,
            "--epochs", str(args.epochs), "--ckpt-every-steps", "10", "--log-every", "5", "--no-progress",
            "--device", "cpu", "--max-bad-steps", "3", "--bad-step-window", "10"]
    spikes = ["--inject-bad-batch", args.bad]
    with tempfile.TemporaryDirectory(prefix="bench-rollback-") as tmp:
        tmp = Path(tmp)
        runs = {"unspiked": train(tmp / "unspiked", base, env),
                "rollback": train(tmp / "rollback", [*base, *spikes, "--on-spike", "rollback", "--skip-batches",
                                                     args.skip_batches], env)}
        code, first, output = train(tmp / "stop", [*base, *spikes], env)
        assert code == 3, output[-2000:]
        code, second, output = train(tmp / "stop", [*base, *spikes, "--resume", "--max-bad-steps", "10"], env)
        assert "last_good.pt" in output, output[-2000:]
        runs["stop + manual resume"] = (code, first + second, output)
        for name, (code, _, output) in runs.items():
            assert code == 0, f"{name}: {output[-2000:]}"
        event = next(r for r in read_metrics(tmp / "rollback" / "metrics.jsonl") if r.get("event") == "rollback")
        loads = []
        for _ in range(5):
            t0 = time.perf_counter()
            load_verified(tmp / "rollback" / "checkpoints" / "last_good.pt")
            loads.append(time.perf_counter() - t0)
        skipped = json.loads((tmp / "rollback" / SKIPPED_FILE).read_text())
        evals = {name: final_eval(tmp / name.split(" ")[0]) for name in runs}
    steps = evals["unspiked"]["step"]
    read = steps + skipped["skipped_batches"]  # batches the rollback run read: the steps it kept and the skipped
    rows = [[name, evals[name]["loss_ema"], evals[name]["acc_ema"], seconds] for name, (_, seconds, _) in runs.items()]
    load = spread(loads)
    text = (f"train_cifar_pro.py, tiny model (width 16), COURSE_FAST=1, data fraction {args.data_fraction}, batch 32, "
            f"{steps} steps, NaN batches at positions {args.bad}, --max-bad-steps 3 of 10, --skip-batches "
            f"{args.skip_batches}; one run per arm\n\n"
            + format_table(rows, ["arm", "final eval loss (EMA)", "final eval acc (EMA)", "wall s"])
            + f"\n\nrollback: {event['seconds'] * 1000:.1f} ms (step {event['bad_step']} -> {event['restored_step']}); "
            f"one load_verified of last_good.pt: {load['median'] * 1000:.1f} ms (median of 5, "
            f"{load['min'] * 1000:.1f}-{load['max'] * 1000:.1f}); ratio {event['seconds'] / load['median']:.1f}x\n"
            f"skipped: {skipped['skipped_batches']} global batches = {skipped['skipped_fraction_of_an_epoch']:.0%} "
            f"of an epoch, {skipped['skipped_batches'] / read:.1%} of the batches the run read")
    print()
    print(text)
    path = write_json("rollback", {"machine": info, "event": event, "load_verified_s": load, "skipped": {
        k: v for k, v in skipped.items() if k != "positions"}, "evals": evals,
        "wall_s": {name: seconds for name, (_, seconds, _) in runs.items()}, "table": text}, args.json)
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
