"""Proof by preemption: the checkpoint interval of ``course_utils.estimate_ckpt``, against real kills.

A simulator runs solutions/homework/train_cifar_pro.py (TinyCNN of width 8, COURSE_FAST data, batch 8, one epoch
of 400 steps, one torch thread, fresh interpreters) and preempts it: SIGKILL at exponentially distributed times
(mean ``--mtbf``: by default 6 R, at least 20 s; seeded), then starts it again with ``--resume`` at once, until a run exits 0. The kill times are
the simulator's own clock (seconds since the job's first start, drawn before it starts): the same times for
every interval of a seed, never a race with a log. A job is one (seed, interval) pair; ``--jobs`` (2: the machine's
cores) run side by side, and every input below is measured in as many streams side by side, under the same load.

1. Inputs, measured here first: the restart tax R (a resumed run's seconds to its first step, and its parts) and
   the first start R0 (a fresh one's), with ``bench/resume_cost.py``'s ``measure``; uninterrupted runs without
   saves (their median wall time gives the work W = wall − R0 − one save) and with a save every 2 steps,
   synchronous and ``--async-ckpt``: the save stall C of each is the extra time over the extra saves.
2. Young's interval τ* = √(2·C·M) (C of the synchronous saves) in steps (``W / 400`` seconds each), and five
   ``--ckpt-every-steps`` intervals around it (divisors of 400, so that every segment is whole).
3. Every (seed, interval) job; its completion time; then the run's sample ledger (``--sample-ledger``: every step's
   sample indices, each process appending) and its metrics against the uninterrupted run: every step trained again
   after a kill saw the same samples, the surviving trajectory holds each sample of the epoch exactly once and is
   the uninterrupted run's, and every logged loss (train steps, final evaluation) equals it exactly.

The prediction of an interval τ: ``expected_segment_time(R0, 0, M)`` (the first start, which a kill sends back to
zero) + ``expected_wall_time(W, τ, C, R, M)``. Criteria: (a) within ±15% of the measured median at every interval;
(b) τ* lies within the range of intervals whose median is at most the third quartile of the best interval (the
curve is flat near its minimum); (c) the ledger and loss checks above hold after every kill. Exit status 1 when
one fails. The plot (``bench/results/preemption.png``, 08 §7 shows it): the predicted curve, the medians with
their interquartile range. ``--hogs 2`` runs two busy loops beside the whole bench (``preemption_hogs.json``).

    python bench/preemption.py                  # 5 intervals x 5 seeds, ~10 minutes on 2 quiet cores
    python bench/preemption.py --hogs 2         # the same beside 2 CPU hogs
    python bench/preemption.py --seeds 1 --intervals 2 --jobs 1 --json /tmp/p.json   # smoke (no plot)
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, format_table, header, machine_info, spread, write_json  # noqa: E402
from resume_cost import bench_env, measure, restart_tax  # noqa: E402

from course_utils.estimate_ckpt import (daly_interval, expected_segment_time, expected_wall_time,  # noqa: E402
                                        young_interval)
from course_utils.monitor import read_metrics  # noqa: E402

SCRIPT = REPO / "solutions" / "homework" / "train_cifar_pro.py"
STEPS, BATCH, FRACTION = 400, 8, 0.64  # 3,200 of the 5,000 COURSE_FAST images // batch 8: one epoch of 400 steps
ARGS = ["--model", "tiny", "--width", "8", "--batch-size", str(BATCH), "--data-fraction", str(FRACTION), "--epochs",
        "1", "--warmup-steps", "5", "--lr", "3e-3", "--log-every", "10", "--ckpt-every-seconds", "0", "--no-progress",
        "--amp", "off", "--device", "cpu", "--hang-timeout", "0", "--sample-ledger"]
DIVISORS = [k for k in range(1, STEPS + 1) if STEPS % k == 0]
SAVE_EVERY = 2  # the uninterrupted runs that measure C save every 2 steps: 200 saves
TOLERANCE = 0.15


def kill_times(seed: int, mtbf_s: float, horizon_s: float) -> list[float]:
    """Seconds after the job's first start at which it is preempted: a Poisson process of rate 1/M, seeded."""
    rng, t, times = random.Random(seed), 0.0, []
    while t < horizon_s:
        t += rng.expovariate(1 / mtbf_s)
        times.append(t)
    return times


def run_job(out: Path, extra: list[str], kills: list[float], env: dict, timeout_s: float) -> dict:
    """Run the script in ``out`` until it exits 0, SIGKILLing it at ``kills`` and restarting it with --resume.

    Returns the wall time from the first start to the successful exit and the kills that landed.
    """
    command = [sys.executable, str(SCRIPT), "--out", str(out), *ARGS, *extra, "--resume"]
    log = open(out.parent / f"{out.name}.log", "a", encoding="utf-8")
    start, landed = time.monotonic(), 0
    try:
        while True:
            proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
            now = time.monotonic() - start
            if now > timeout_s:
                proc.kill()
                raise RuntimeError(f"{out.name}: not finished after {timeout_s:.0f} s ({landed} kills)")
            pending = [k for k in kills if k > now]
            try:
                code = proc.wait(timeout=pending[0] - now if pending else None)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)  # a preemption: no warning, nothing saved
                proc.wait()
                landed += 1
                continue
            if code != 0:
                raise RuntimeError(f"{out.name}: exit code {code}, see {log.name}")
            return {"wall_s": time.monotonic() - start, "kills": landed}
    finally:
        log.close()


def trajectory(out: Path) -> dict:
    """The run's ledger and losses: {"steps": {step: indices}, "replays_differ": n, "losses": [...], "eval": {...}}."""
    steps: dict[int, list[int]] = {}
    differ = 0
    for record in read_metrics(out / "sample_ledger.jsonl"):  # every executed step, abandoned ones included
        indices = record["indices"][0]
        differ += record["step"] in steps and steps[record["step"]] != indices
        steps[record["step"]] = indices  # the last execution of a step is the surviving trajectory's
    metrics = read_metrics(out / "metrics.jsonl")
    losses = [(r["step"], r["loss"]) for r in metrics if r.get("split") == "train"]
    evals = [{k: r[k] for k in ("step", "loss", "acc", "loss_ema", "acc_ema")} for r in metrics if r.get("split") == "val"]
    return {"steps": steps, "replays_differ": differ, "losses": losses, "eval": evals}


def verify(out: Path, reference: dict) -> dict[str, bool]:
    """The ledger and loss checks of one job against the uninterrupted run."""
    got = trajectory(out)
    seen = [i for step in sorted(got["steps"]) for i in got["steps"][step]]
    return {"replayed steps saw the same samples": got["replays_differ"] == 0,
            "each sample once": sorted(got["steps"]) == list(range(1, STEPS + 1)) and len(seen) == len(set(seen))
            == STEPS * BATCH,
            "same samples as uninterrupted": got["steps"] == reference["steps"],
            "same losses as uninterrupted": got["losses"] == reference["losses"] and got["eval"] == reference["eval"]}


def uninterrupted(tmp: Path, env: dict, streams: int, log) -> dict:
    """Runs without kills, ``streams`` side by side (as the jobs run): each stream runs the three modes in its own
    order: no saves (the reference), a save every SAVE_EVERY steps, synchronous and asynchronous."""
    modes = {"no saves": ["--ckpt-every-steps", "0"], "sync saves": ["--ckpt-every-steps", str(SAVE_EVERY)],
             "async saves": ["--ckpt-every-steps", str(SAVE_EVERY), "--async-ckpt"]}
    wall: dict[str, list[float]] = {mode: [] for mode in modes}

    def stream(r: int) -> None:
        for mode in list(modes)[r % 3:] + list(modes)[:r % 3]:
            out = tmp / f"plain_{mode.replace(' ', '_')}_{r}"
            wall[mode].append(run_job(out, modes[mode], [], env, 1800)["wall_s"])
        log(f"  uninterrupted stream {r + 1}/{streams} done")
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(stream, range(streams)))
    extra = STEPS // SAVE_EVERY - 1  # the final save happens in every mode
    med = {mode: statistics.median(w) for mode, w in wall.items()}
    log("  uninterrupted, medians: " + ", ".join(f"{m} {v:.2f}s" for m, v in med.items()))
    return {"wall_s": wall, "C_sync": (med["sync saves"] - med["no saves"]) / extra,
            "C_async": (med["async saves"] - med["no saves"]) / extra,
            "reference": trajectory(tmp / "plain_no_saves_0")}


def choose_intervals(tau_steps: float, count: int) -> list[int]:
    """``count`` divisors of STEPS spread around ``tau_steps`` on a log scale (from about /8 to x8)."""
    targets = [tau_steps * 8 ** (2 * i / (count - 1) - 1) for i in range(count)] if count > 1 else [tau_steps]
    chosen: list[int] = []
    for target in targets:
        ranked = sorted(DIVISORS, key=lambda k: abs(math.log(k / target)))
        chosen.append(next(k for k in ranked if k not in chosen))
    return sorted(chosen)


def predict(inputs: dict, tau_s: float) -> float:
    """Expected completion time of a job saving every ``tau_s`` seconds of work (module docstring)."""
    m = inputs["M"]
    return (expected_segment_time(inputs["R0"], 0, m)
            + expected_wall_time(inputs["W"], tau_s, inputs["C_sync"], inputs["R"], m))


def verdicts(inputs: dict, rows: list[dict], checks: list[dict]) -> dict:
    """The three criteria of the module docstring, with what decided them."""
    best = min(rows, key=lambda row: row["measured"]["median"])
    near = [row["steps"] for row in rows if row["measured"]["median"] <= best["measured"]["q3"]]
    worst = max(abs(row["predicted_s"] / row["measured"]["median"] - 1) for row in rows)
    failed = sorted({name for check in checks for name, ok in check.items() if not ok})
    return {"prediction within 15%": worst <= TOLERANCE, "worst prediction error": worst,
            "tau* inside the near-best range": min(near) <= inputs["tau_steps"] <= max(near),
            "near-best range (steps)": [min(near), max(near)], "exact resume after every kill": not failed,
            "failed checks": failed, "kills": sum(row["kills"] for row in rows)}


def report(inputs: dict, rows: list[dict], verdict: dict, parts: dict, loads: list[float]) -> str:
    step_ms = 1e3 * inputs["W"] / STEPS
    lines = [f"train_cifar_pro.py, tiny model (width 8), COURSE_FAST=1, batch {BATCH}, one epoch of {STEPS} steps, 1 torch "
             f"thread, fresh interpreters, {inputs['jobs']} jobs side by side; preemptions: SIGKILL at exponential times, mean M = {inputs['M']:g} s; "
             f"{inputs['seeds']} seeds x {len(rows)} intervals, the same kill times for every interval of a seed; "
             f"{inputs['hogs']} CPU hog(s) beside it; load average (1 min) {min(loads):.2f}-{max(loads):.2f} during the bench",
             "", "measured inputs"]
    table = [["work W (uninterrupted, no saves, less R0 and one save)", f"{inputs['W']:.2f} s ({step_ms:.1f} ms/step)"],
             ["first start R0 (fresh run's time to its first step)", f"{inputs['R0']:.2f} s"],
             ["restart tax R (resumed run's time to its first step, less one step)", f"{inputs['R']:.2f} s"],
             *[[f"  of which {k}", f"{v:.2f} s"] for k, v in parts.items() if k != "R"],
             [f"save stall C, synchronous (a save every {SAVE_EVERY} steps vs none)", f"{1e3 * inputs['C_sync']:.1f} ms"],
             ["save stall C, --async-ckpt", f"{1e3 * inputs['C_async']:.1f} ms"],
             ["Young tau* = sqrt(2 C M) (synchronous C)", f"{inputs['tau_s']:.2f} s = {inputs['tau_steps']:.1f} steps"],
             ["Daly's refinement", f"{daly_interval(inputs['C_sync'], inputs['M']):.2f} s"],
             ["Young tau* with the asynchronous C", f"{young_interval(max(inputs['C_async'], 0), inputs['M']):.2f} s"]]
    lines.append(format_table(table, ["input", "value"]))
    body = [[f"{row['steps']}", f"{row['tau_s']:.2f}", f"{row['predicted_s']:.1f}",
             f"{row['measured']['median']:.1f} ({row['measured']['q1']:.1f}-{row['measured']['q3']:.1f})",
             f"{100 * (row['predicted_s'] / row['measured']['median'] - 1):+.1f}%", str(row["kills"])] for row in rows]
    lines += ["", format_table(body, ["interval (steps)", "tau (s of work)", "predicted s",
                                      "measured s, median (IQR)", "predicted / median - 1", "kills"])]
    ok = lambda b: "ok" if b else "MISSED"  # noqa: E731
    lines += ["", format_table([
        ["prediction within ±15% of the median at every interval", f"worst {100 * verdict['worst prediction error']:.1f}%",
         ok(verdict["prediction within 15%"])],
        ["tau* inside the intervals whose median <= the best one's 3rd quartile",
         f"{inputs['tau_steps']:.1f} in {verdict['near-best range (steps)']} steps", ok(verdict["tau* inside the near-best range"])],
        ["after every kill: same samples, each once, same losses as uninterrupted",
         f"{verdict['kills']} kills, failed: {', '.join(verdict['failed checks']) or 'none'}",
         ok(verdict["exact resume after every kill"])]], ["criterion", "measured", "verdict"])]
    return "\n".join(lines)


def plot(inputs: dict, rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    taus = [inputs["W"] / STEPS * k for k in range(1, STEPS + 1)]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(taus, [predict(inputs, t) for t in taus], label="predicted E[T] (estimate_ckpt)")
    meds = [row["measured"]["median"] for row in rows]
    err = [[m - row["measured"]["q1"] for m, row in zip(meds, rows)], [row["measured"]["q3"] - m for m, row in zip(meds, rows)]]
    ax.errorbar([row["tau_s"] for row in rows], meds, yerr=err, fmt="o", capsize=4,
                label=f"measured: median and IQR of {inputs['seeds']} seeds")
    ax.axvline(inputs["tau_s"], color="green", linestyle="--", label=f"Young tau* = {inputs['tau_s']:.2f} s")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval tau (seconds of work)")
    ax.set_ylabel("wall time to finish (s)")
    ax.set_title(f"preempted every {inputs['M']:g} s on average; W = {inputs['W']:.1f} s of work, R = {inputs['R']:.1f} s"
                 + (f", {inputs['hogs']} CPU hogs" if inputs["hogs"] else ""))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure_inputs(args: argparse.Namespace, tmp: Path, env: dict, log) -> tuple[dict, dict, dict]:
    """R0, R (and its parts), C (synchronous and asynchronous), W, each measured in ``args.jobs`` streams side by side
    (the conditions of the jobs); the reference trajectory."""
    config = argparse.Namespace(ckpt_step=10, model="tiny", width=8, data_fraction=FRACTION, batch_size=BATCH,
                                homework=False, threads=1, device="cpu", repeats=1)
    with ThreadPoolExecutor(args.jobs) as pool:
        streams = list(pool.map(lambda _: measure(config, env, log), range(args.jobs)))
    restart = {"rows": {k: [x for m in streams for x in m["rows"][k]] for k in streams[0]["rows"]},
               "parts": [p for m in streams for p in m["parts"]], "step_s": [x for m in streams for x in m["step_s"]]}
    parts = restart_tax(restart)
    plain = uninterrupted(tmp, env, args.jobs, log)
    r0 = statistics.median(x["first_step_s"] for x in restart["rows"]["fresh start"])
    work = statistics.median(plain["wall_s"]["no saves"]) - r0 - plain["C_sync"]
    if work <= 0 or plain["C_sync"] <= 0:  # R0 comes from other runs than W: a load that changed between them shows
        raise SystemExit(f"the inputs contradict each other (W {work:.2f} s, C {plain['C_sync']:.4f} s, R0 {r0:.2f} s): "
                         f"the machine's load changed during the measurements ({os.getloadavg()}); run it again")
    mtbf = args.mtbf or max(20.0, round(6 * parts["R"]))
    tau_s = young_interval(plain["C_sync"], mtbf)
    inputs = {"M": mtbf, "R0": r0, "R": parts["R"], "W": work, "C_sync": plain["C_sync"],
              "C_async": plain["C_async"], "tau_s": tau_s, "tau_steps": tau_s / work * STEPS, "seeds": args.seeds,
              "hogs": args.hogs, "jobs": args.jobs}
    return inputs, parts, {"restart": restart, "uninterrupted": {k: v for k, v in plain.items() if k != "reference"},
                           "reference": plain["reference"]}


def run_all(args: argparse.Namespace, inputs: dict, reference: dict, tmp: Path, env: dict, loads: list[float],
            log) -> tuple[list[dict], list[dict]]:
    """Every (seed, interval) job, ``args.jobs`` at a time, intervals in a rotated order per seed; rows per interval
    and every job's checks."""
    intervals = choose_intervals(inputs["tau_steps"], args.intervals)
    walls: dict[int, list[float]] = {k: [] for k in intervals}
    kills = dict.fromkeys(intervals, 0)
    checks = []
    plan = [(seed, k) for s, seed in enumerate(range(1, args.seeds + 1))
            for k in intervals[s % len(intervals):] + intervals[:s % len(intervals)]]

    def one(job: tuple[int, int]) -> None:
        seed, k = job
        out = tmp / f"job_{seed}_{k}"
        result = run_job(out, ["--ckpt-every-steps", str(k)], kill_times(seed, inputs["M"], 3600), env, 3600)
        checks.append(verify(out, reference))
        walls[k].append(result["wall_s"])
        kills[k] += result["kills"]
        loads.append(os.getloadavg()[0])
        shutil.rmtree(out)
        log(f"  seed {seed}, every {k} steps: {result['wall_s']:.1f} s, {result['kills']} kills, "
            f"checks {'ok' if all(checks[-1].values()) else checks[-1]}")
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, plan))
    rows = []
    for k in intervals:
        tau_s = inputs["W"] / STEPS * k
        rows.append({"steps": k, "tau_s": tau_s, "predicted_s": predict(inputs, tau_s), "measured": spread(walls[k]),
                     "wall_s": walls[k], "kills": kills[k]})
    return rows, checks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mtbf", type=float, default=0.0,
                   help="M: mean seconds between preemptions (0: 6 R, at least 20 s: the restart tax counts, "
                        "e^{R/M} about 1.18, and a loaded machine does not push the job into the runaway regime)")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--intervals", type=int, default=5)
    p.add_argument("--jobs", type=int, default=2, help="jobs side by side (one torch thread each; the inputs too)")
    p.add_argument("--hogs", type=int, default=0, help="busy loops started beside the bench (killed at its end)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    env = bench_env(1)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        import torch  # for machine info only
        torch.set_num_threads(1)
        info = machine_info(torch.device("cpu"))
        print(header(info))
        loads = [os.getloadavg()[0]]
        with tempfile.TemporaryDirectory(prefix="bench-preempt-", dir=REPO) as tmp:
            log = functools.partial(print, flush=True)
            inputs, parts, raw = measure_inputs(args, Path(tmp), env, log)
            log(f"  W {inputs['W']:.2f} s, R0 {inputs['R0']:.2f} s, R {inputs['R']:.2f} s, C {1e3 * inputs['C_sync']:.1f} ms"
                  f" (async {1e3 * inputs['C_async']:.1f} ms): tau* {inputs['tau_s']:.2f} s = {inputs['tau_steps']:.1f} steps")
            rows, checks = run_all(args, inputs, raw.pop("reference"), Path(tmp), env, loads, log)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    verdict = verdicts(inputs, rows, checks)
    text = report(inputs, rows, verdict, parts, loads)
    print()
    print(text)
    name = "preemption_hogs" if args.hogs else "preemption"
    if args.json is None:
        plot(inputs, rows, Path(__file__).resolve().parent / "results" / f"{name}.png")
    passed = verdict["prediction within 15%"] and verdict["tau* inside the near-best range"] and \
        verdict["exact resume after every kill"]
    path = write_json(name, {"machine": info, "inputs": inputs, "restart_tax": parts, "rows": rows, "verdict": verdict,
                             "passed": passed, "load_avg_1m": loads, "measurements": raw, "table": text}, args.json)
    print(f"\nJSON: {path}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
