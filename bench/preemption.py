"""Proof by preemption: the checkpoint interval of ``course_utils.estimate_ckpt``, against real kills.

A simulator runs solutions/homework/train_cifar_pro.py (TinyCNN of width 8, COURSE_FAST data, batch 8, two epochs
of 400 steps, one torch thread, fresh interpreters) and preempts it: SIGKILL at exponentially distributed times
(mean ``--mtbf``: by default an uninterrupted run's wall time, at least 20 s; seeded), then starts it again with ``--resume`` at once, until a
run exits 0. The kill times are the simulator's own clock (seconds since the job's first start, drawn before it
starts): the same times for every interval of a seed, never a race with a log. ``--jobs`` (2: the machine's cores)
jobs run side by side.

1. A short pre-phase: R's parts (``bench/resume_cost.py``'s ``measure``: reported, and 08 §7 prints them), then
   one uninterrupted run per mode and stream (no saves, a save every 2 steps synchronous and ``--async-ckpt``)
   gives a first save stall C, so that Young's τ* = √(2·C·M) can place five
   ``--ckpt-every-steps`` intervals around it (divisors of 400, so that every segment is whole), and M.
2. The model's inputs are then measured in the same conditions as the preempted jobs, interleaved with them: each
   seed's plan holds two uninterrupted runs (no saves; synchronous saves every 2 steps) beside its preempted jobs,
   in the same queue. Every process's time to its first step is taken where it runs (the simulator watches the
   run's sample ledger grow; it never schedules anything from it): R0 is the first processes' median (uninterrupted
   runs and jobs), R the restarted processes' median less one step, W the uninterrupted runs' wall time less their
   own first start and epoch-end saves (so W never goes negative through a load that changed between two measurements),
   C the median over seeds of (saves − no saves) / extra saves.
3. Every job's completion time; then the run's sample ledger (``--sample-ledger``: every step's sample indices, each
   process appending) and its metrics against an uninterrupted run: every step trained again after a kill saw the
   same samples, the surviving trajectory holds each sample once per epoch and is the uninterrupted run's, and every
   logged loss (train steps, evaluations) equals it exactly.

The prediction of an interval τ: ``expected_segment_time(R0, 0, M)`` (the first start, which a kill sends back to
zero) + ``expected_wall_time(W, τ, C, R, M)``. Criteria: (a) within ±15% of the measured median at every interval;
(b) τ* lies within the range of intervals whose median is at most the third quartile of the best interval (the
curve is flat near its minimum); (c) the ledger and loss checks above hold after every kill, with at least 20
kills. Exit status 1 when one fails. The plot (``bench/results/preemption.png``): the predicted curve, the medians
with their interquartile range. ``--hogs 2`` runs two busy loops beside the whole bench (``preemption_hogs.json``).

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
EPOCH_STEPS, EPOCHS, BATCH, FRACTION = 400, 2, 8, 0.64  # 3,200 of the 5,000 COURSE_FAST images // batch 8
STEPS = EPOCH_STEPS * EPOCHS
ARGS = ["--model", "tiny", "--width", "8", "--batch-size", str(BATCH), "--data-fraction", str(FRACTION), "--epochs",
        str(EPOCHS), "--warmup-steps", "5", "--lr", "3e-3", "--log-every", "10", "--ckpt-every-seconds", "0",
        "--no-progress", "--amp", "off", "--device", "cpu", "--hang-timeout", "0", "--sample-ledger"]
DIVISORS = [k for k in range(1, EPOCH_STEPS + 1) if EPOCH_STEPS % k == 0]
SAVE_EVERY = 2  # the runs that measure C save every 2 steps: 398 extra saves, seconds above the load's noise
EXTRA_SAVES = STEPS // SAVE_EVERY - EPOCHS  # the epoch-end saves happen in every mode
MODES = {"no saves": ["--ckpt-every-steps", "0"], "sync saves": ["--ckpt-every-steps", str(SAVE_EVERY)],
         "async saves": ["--ckpt-every-steps", str(SAVE_EVERY), "--async-ckpt"]}
TOLERANCE, MIN_KILLS, POLL_S = 0.15, 20, 0.02


def kill_times(seed: int, mtbf_s: float, horizon_s: float) -> list[float]:
    """Seconds after the job's first start at which it is preempted: a Poisson process of rate 1/M, seeded."""
    rng, t, times = random.Random(seed), 0.0, []
    while t < horizon_s:
        t += rng.expovariate(1 / mtbf_s)
        times.append(t)
    return times


def run_process(command: list[str], out: Path, env: dict, log, job_start: float, kills: list[float]) -> dict:
    """One process of a job: killed at the first of ``kills`` (the job's clock) that falls while it runs.

    Its seconds to its first step are read from the sample ledger's growth (a measurement only: no kill waits on it).
    """
    ledger = out / "sample_ledger.jsonl"
    size = ledger.stat().st_size if ledger.exists() else 0
    started = time.monotonic()
    pending = [k for k in kills if k > started - job_start]
    proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    first = None
    while proc.poll() is None:
        now = time.monotonic()
        if first is None and ledger.exists() and ledger.stat().st_size > size:
            first = now - started
        if pending and now - job_start >= pending[0]:
            proc.kill()  # a preemption: SIGKILL, no warning, nothing saved
            proc.wait()
            return {"first_step_s": first, "killed": True, "code": None}
        time.sleep(POLL_S)
    return {"first_step_s": first, "killed": False, "code": proc.returncode}


def run_job(out: Path, extra: list[str], kills: list[float], env: dict, timeout_s: float) -> dict:
    """Run the script in ``out`` until it exits 0, SIGKILLing it at ``kills`` and restarting it with --resume.

    Returns the wall time from the first start to the successful exit, the kills and every process's first step.
    """
    command = [sys.executable, str(SCRIPT), "--out", str(out), *ARGS, *extra, "--resume"]
    starts: list[dict] = []
    with open(out.parent / f"{out.name}.log", "a", encoding="utf-8") as log:
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            starts.append(run_process(command, out, env, log, start, kills))
            if starts[-1]["killed"]:
                continue
            if starts[-1]["code"] != 0:
                raise RuntimeError(f"{out.name}: exit code {starts[-1]['code']}, see {log.name}")
            return {"wall_s": time.monotonic() - start, "kills": len(starts) - 1, "starts": starts}
    raise RuntimeError(f"{out.name}: not finished after {timeout_s:.0f} s ({len(starts) - 1} kills)")


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


def prephase(tmp: Path, env: dict, streams: int, log) -> dict:
    """``streams`` side by side: R's parts (``bench/resume_cost.py``'s ``measure``, reported), then uninterrupted runs,
    each stream the three MODES in its own order: a first C (to place the intervals), the asynchronous C (reported)
    and a first R0 (to set M)."""
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}

    def stream(r: int) -> None:
        for mode in list(MODES)[r % 3:] + list(MODES)[:r % 3]:
            runs[mode].append(run_job(tmp / f"pre_{mode.replace(' ', '_')}_{r}", MODES[mode], [], env, 900))
    config = argparse.Namespace(ckpt_step=10, model="tiny", width=8, data_fraction=FRACTION, batch_size=BATCH,
                                homework=False, threads=1, device="cpu", repeats=1)
    with ThreadPoolExecutor(streams) as pool:
        tax = list(pool.map(lambda _: measure(config, env, log), range(streams)))
        list(pool.map(stream, range(streams)))
    restart = {"rows": {k: [x for m in tax for x in m["rows"][k]] for k in tax[0]["rows"]},
               "parts": [p for m in tax for p in m["parts"]], "step_s": [x for m in tax for x in m["step_s"]]}
    med = {mode: statistics.median(x["wall_s"] for x in v) for mode, v in runs.items()}
    r0 = statistics.median(x["starts"][0]["first_step_s"] or x["wall_s"] for v in runs.values() for x in v)
    log("  pre-phase medians: " + ", ".join(f"{m} {v:.2f}s" for m, v in med.items()) + f", first step {r0:.2f}s")
    return {"wall_s": {mode: [x["wall_s"] for x in v] for mode, v in runs.items()}, "R0": r0,
            "restart_tax": restart_tax(restart), "restart_runs": restart,
            "C_sync": (med["sync saves"] - med["no saves"]) / EXTRA_SAVES,
            "C_async": (med["async saves"] - med["no saves"]) / EXTRA_SAVES}


def choose_intervals(tau_steps: float, count: int) -> list[int]:
    """``count`` divisors of an epoch's steps spread around ``tau_steps`` on a log scale (from about /8 to x8)."""
    targets = [tau_steps * 8 ** (2 * i / (count - 1) - 1) for i in range(count)] if count > 1 else [tau_steps]
    chosen: list[int] = []
    for target in targets:
        ranked = sorted(DIVISORS, key=lambda k: abs(math.log(k / target)))
        chosen.append(next(k for k in ranked if k not in chosen))
    return sorted(chosen)


def model_inputs(plain: dict[str, dict[int, dict]], jobs: list[dict], mtbf: float) -> dict:
    """W, R0, R, C and the step time, all from the interleaved runs (module docstring, 2.); stops with a message when
    they contradict each other (a non-positive save stall, work or restart tax)."""
    seeds = sorted(plain["no saves"])
    c = statistics.median((plain["sync saves"][s]["wall_s"] - plain["no saves"][s]["wall_s"]) / EXTRA_SAVES
                          for s in seeds)
    firsts = [x["starts"][0]["first_step_s"] for x in [*plain["no saves"].values(), *plain["sync saves"].values(), *jobs]]
    r0 = statistics.median(f for f in firsts if f is not None)
    work = statistics.median(x["wall_s"] - x["starts"][0]["first_step_s"] - EPOCHS * c  # its epoch-end saves
                             for x in plain["no saves"].values())
    restarts = [s["first_step_s"] for x in jobs for s in x["starts"][1:] if s["first_step_s"] is not None]
    r = statistics.median(restarts) - work / STEPS if restarts else float("nan")
    if not (c > 0 and work > 0 and r > 0):
        raise SystemExit(f"the inputs contradict each other, measured in the same runs: C {c:.4f} s (saves minus no "
                         f"saves, per extra save), W {work:.2f} s, R {r:.2f} s ({len(restarts)} restarts reached a "
                         f"step); load average {os.getloadavg()}: too noisy a machine for {len(seeds)} seeds")
    tau_s = young_interval(c, mtbf)
    return {"M": mtbf, "R0": r0, "R": r, "W": work, "step_s": work / STEPS, "C_sync": c, "tau_s": tau_s,
            "tau_steps": tau_s / work * STEPS, "restarts_timed": len(restarts),
            "R_spread": spread(restarts) if restarts else None, "R0_spread": spread([f for f in firsts if f is not None])}


def run_all(args: argparse.Namespace, intervals: list[int], mtbf: float, tmp: Path, env: dict, loads: list[float],
            log) -> tuple[dict, list[dict], dict[int, list[dict]], list[dict]]:
    """Each seed's two uninterrupted runs and its preempted jobs (one per interval), in a rotated order per seed,
    ``args.jobs`` at a time; every run's ledger and losses checked against the first uninterrupted run."""
    plain: dict[str, dict[int, dict]] = {"no saves": {}, "sync saves": {}}
    results: dict[int, list[dict]] = {k: [] for k in intervals}
    paths: dict[tuple, dict] = {}
    plan = []
    for s, seed in enumerate(range(1, args.seeds + 1)):
        items = [(mode, 0) for mode in plain] + [("job", k) for k in intervals]
        plan += [(seed, *item) for item in items[2 * s % len(items):] + items[:2 * s % len(items)]]

    def one(job: tuple[int, str, int]) -> None:
        seed, what, k = job
        out = tmp / f"{what.replace(' ', '_')}_{seed}_{k}"
        if what == "job":
            result = run_job(out, ["--ckpt-every-steps", str(k)], kill_times(seed, mtbf, 3600), env, 1200)
            results[k].append(result)
        else:
            result = plain[what][seed] = run_job(out, MODES[what], [], env, 1200)
        paths[job] = trajectory(out)
        shutil.rmtree(out)
        loads.append(os.getloadavg()[0])
        log(f"  seed {seed}, {what if what != 'job' else f'every {k} steps'}: {result['wall_s']:.1f} s, "
            f"{result['kills']} kills, load {loads[-1]:.2f}")
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, plan))
    reference = paths[(1, "no saves", 0)]
    checks = [check_against(paths[job], reference) for job in plan]
    return plain, [x for k in intervals for x in results[k]], results, checks


def check_against(got: dict, reference: dict) -> dict[str, bool]:
    """``verify``'s checks on a trajectory already read."""
    epochs = [[i for step in range(e * EPOCH_STEPS + 1, (e + 1) * EPOCH_STEPS + 1) for i in got["steps"].get(step, [])]
              for e in range(EPOCHS)]
    return {"replayed steps saw the same samples": got["replays_differ"] == 0,
            "each sample once per epoch": sorted(got["steps"]) == list(range(1, STEPS + 1)) and all(
                len(seen) == len(set(seen)) == EPOCH_STEPS * BATCH for seen in epochs),
            "same samples as uninterrupted": got["steps"] == reference["steps"],
            "same losses as uninterrupted": got["losses"] == reference["losses"] and got["eval"] == reference["eval"]}


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
    kills = sum(row["kills"] for row in rows)
    return {"prediction within 15%": worst <= TOLERANCE, "worst prediction error": worst,
            "tau* inside the near-best range": min(near) <= inputs["tau_steps"] <= max(near),
            "near-best range (steps)": [min(near), max(near)], "exact resume after every kill": not failed,
            "failed checks": failed, "kills": kills, f"at least {MIN_KILLS} kills": kills >= MIN_KILLS,
            "runs checked": len(checks)}


def report(inputs: dict, pre: dict, rows: list[dict], verdict: dict, loads: list[float]) -> str:
    lines = [f"train_cifar_pro.py, tiny model (width 8), COURSE_FAST=1, batch {BATCH}, {EPOCHS} epochs of {EPOCH_STEPS} "
             f"steps, 1 torch thread, fresh interpreters, {inputs['jobs']} runs side by side; preemptions: SIGKILL at "
             f"exponential times, mean M = {inputs['M']:g} s; {inputs['seeds']} seeds x {len(rows)} intervals, the same "
             f"kill times for every interval of a seed, two uninterrupted runs per seed interleaved with the jobs; "
             f"{inputs['hogs']} CPU hog(s) beside it; load average (1 min) {min(loads):.2f}-{max(loads):.2f} during "
             "the bench", "", "measured inputs (interleaved with the jobs)"]
    r, r0 = inputs["R_spread"], inputs["R0_spread"]
    table = [["work W (uninterrupted, no saves, less its own first start and its 2 epoch-end saves)",
              f"{inputs['W']:.2f} s ({1e3 * inputs['step_s']:.1f} ms/step)"],
             ["first start R0 (a first process's time to its first step)",
              f"{inputs['R0']:.2f} s (IQR {r0['q1']:.2f}-{r0['q3']:.2f}, n {r0['n']})"],
             ["restart tax R (a restarted process's time to its first step, less one step)",
              f"{inputs['R']:.2f} s (IQR {r['q1']:.2f}-{r['q3']:.2f}, n {r['n']})"],
             *[[f"  R's parts (bench/resume_cost.py, pre-phase): {k}", f"{v:.2f} s"] for k, v in pre["restart_tax"].items()],
             [f"save stall C, synchronous (a save every {SAVE_EVERY} steps vs none, paired by seed)",
              f"{1e3 * inputs['C_sync']:.1f} ms"],
             ["pre-phase: save stall C synchronous / --async-ckpt",
              f"{1e3 * pre['C_sync']:.1f} ms / {1e3 * pre['C_async']:.1f} ms"],
             ["Young tau* = sqrt(2 C M)", f"{inputs['tau_s']:.2f} s = {inputs['tau_steps']:.1f} steps"],
             ["Daly's refinement", f"{daly_interval(inputs['C_sync'], inputs['M']):.2f} s"]]
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
        ["after every kill: same samples, each once per epoch, same losses as uninterrupted",
         f"{verdict['runs checked']} runs, failed: {', '.join(verdict['failed checks']) or 'none'}",
         ok(verdict["exact resume after every kill"])],
        [f"at least {MIN_KILLS} kills", str(verdict["kills"]), ok(verdict[f"at least {MIN_KILLS} kills"])]],
        ["criterion", "measured", "verdict"])]
    return "\n".join(lines)


def plot(inputs: dict, rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    taus = [inputs["step_s"] * k for k in range(1, EPOCH_STEPS + 1)]
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
                 + (f", {inputs['hogs']} CPU hogs" if inputs["hogs"] else ""), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def place(args: argparse.Namespace, pre: dict) -> tuple[float, list[int]]:
    """M and the intervals, from the pre-phase: Young's τ* in steps and ``args.intervals`` divisors around it."""
    work = statistics.median(pre["wall_s"]["no saves"]) - pre["R0"] - EPOCHS * pre["C_sync"]
    if pre["C_sync"] <= 0 or work <= 0:
        raise SystemExit(f"pre-phase: saves measured no slower than no saves (C {pre['C_sync']:.4f} s) or no work left "
                         f"(W {work:.2f} s): load average {os.getloadavg()}, too noisy to place the intervals")
    mtbf = args.mtbf or max(20.0, round(statistics.median(pre["wall_s"]["no saves"])))  # about a kill per job
    return mtbf, choose_intervals(young_interval(pre["C_sync"], mtbf) / work * STEPS, args.intervals)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mtbf", type=float, default=0.0,
                   help="M: mean seconds between preemptions (0: the pre-phase's uninterrupted wall time, at least "
                        "20 s: about one kill per job, at least 20 kills in 25 jobs, a restart tax below M)")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--intervals", type=int, default=5)
    p.add_argument("--jobs", type=int, default=2, help="runs side by side (one torch thread each)")
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
        loads, log = [os.getloadavg()[0]], functools.partial(print, flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-preempt-") as tmp:
            pre = prephase(Path(tmp), env, args.jobs, log)
            mtbf, intervals = place(args, pre)
            log(f"  M {mtbf:g} s, intervals {intervals} steps")
            plain, jobs, results, checks = run_all(args, intervals, mtbf, Path(tmp), env, loads, log)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    try:
        inputs = {**model_inputs(plain, jobs, mtbf), "seeds": args.seeds, "hogs": args.hogs, "jobs": args.jobs}
    except SystemExit:  # keep what was measured, outside bench/results/
        write_json("preemption", {"machine": info, "load_avg_1m": loads, "measurements": {
            "prephase": pre, "uninterrupted": plain, "jobs": results}}, Path(tempfile.gettempdir()) / "preemption_raw.json")
        raise
    rows = [{"steps": k, "tau_s": inputs["step_s"] * k, "predicted_s": predict(inputs, inputs["step_s"] * k),
             "measured": spread([x["wall_s"] for x in results[k]]), "wall_s": [x["wall_s"] for x in results[k]],
             "kills": sum(x["kills"] for x in results[k])} for k in intervals]
    verdict = verdicts(inputs, rows, checks)
    text = report(inputs, pre, rows, verdict, loads)
    print("\n" + text)
    name = "preemption_hogs" if args.hogs else "preemption"
    if args.json is None:
        plot(inputs, rows, Path(__file__).resolve().parent / "results" / f"{name}.png")
    passed = all(verdict[k] for k in ("prediction within 15%", "tau* inside the near-best range",
                                      "exact resume after every kill", f"at least {MIN_KILLS} kills"))
    raw = {"prephase": pre, "uninterrupted": plain, "jobs": results}
    path = write_json(name, {"machine": info, "inputs": inputs, "restart_tax": pre["restart_tax"], "rows": rows, "verdict": verdict, "passed": passed,
                             "load_avg_1m": loads, "measurements": raw, "table": text}, args.json)
    print(f"\nJSON: {path}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
