"""Proof by preemption: the checkpoint interval of ``course_utils.estimate_ckpt``, against real kills.

A simulator runs solutions/homework/train_cifar_pro.py (TinyCNN of width 16, COURSE_FAST data at 0.96, batch 4, three
epochs of 1,200 steps, one torch thread, fresh interpreters), SIGKILLs it at exponential times of mean ``--mtbf``
(``mtbf_rule``) drawn from a seed on its own clock before the job starts (the same for every interval of a seed, never
a race with a log), and restarts it with ``--resume`` until it exits 0; ``--jobs`` (2) side by side, a slot the queue
no longer fills running the script (``keep_busy``). The ``--ckpt-every-steps`` grid (divisors of 1,200, geometric: 1,
6, 40, 200, 1200) spans both ways to lose: a save after every step (the saves' cost C dominates: batch 4 puts a step
and a save in the same order of magnitude) and the epoch-end saves alone (a kill loses the epoch so far); τ* near
60-70 steps. Three epochs, 9 seeds: a median of a few seeds jumps by R (3 s) and the lost work when the median seed's
kill falls at its end or a save; one epoch (c8d92a6), two with 5 seeds (5e6fcfe), three with 7 (cc7efc5) missed so.

1. Pre-phase: R's parts (``bench/resume_cost.py``'s ``measure``; 08 §7 prints them), one uninterrupted run per mode
   and stream (no saves, a synchronous and an ``--async-ckpt`` save after every step): a first W, C, R0 and M, and
   the forecast said before any job runs (E[T], each seed's kill times replayed with ``replay_wall_time``, the
   near-best range, τ* and the grid's ends inside it or not).
2. The verdict's inputs come from runs interleaved with the jobs (per seed: no saves, a synchronous save after every
   step): R0 the first processes' median time to their first step, R the median time from a kill to the restarted
   process's first step less one step (the simulator watches the ledger grow), W the no-save runs' median wall time
   less their first start and epoch-end saves, C the median over seeds of the extra time per extra save.
3. Every job's time; its sample ledger (``--sample-ledger``) and metrics against an uninterrupted run: a step
   trained again after a kill saw the same samples, each sample once per epoch, every logged loss equal.

Criteria (exit status 1 when one fails): (a) each interval's prediction, the median over seeds of their replays, within
±15% of the measured median, the epoch-end-only interval included. E[T] (``expected_segment_time(R0, 0, M)`` +
``expected_wall_time(W, τ, C, R, M)``, the replays' mean over all schedules) is printed and not judged: a job meets 0
to over 10 kills, so a median of a few seeds often lies 15% from a mean. (b) τ* inside the range of intervals whose
median is at most the best interval's third quartile, with whether both grid ends lie outside it. (c) the ledger and
loss checks after every kill, at least 20 kills. ``results/preemption.png``: E[T], the replays', the measured medians.

    python bench/preemption.py                  # 5 intervals x 9 seeds, about 26 minutes on 2 quiet cores
    python bench/preemption.py --hogs 2         # beside 2 busy loops (preemption_hogs.json), about 50 min (15:47 run)
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
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, header, machine_info, spread, write_json  # noqa: E402
from preemption_checks import check_against, trajectory  # noqa: E402
from preemption_report import plot, report  # noqa: E402
from resume_cost import bench_env, measure, restart_tax  # noqa: E402

from course_utils.estimate_ckpt import (expected_segment_time, expected_wall_time, replay_wall_time,  # noqa: E402
                                        young_interval)

SCRIPT = REPO / "solutions" / "homework" / "train_cifar_pro.py"
EPOCH_STEPS, EPOCHS, BATCH, FRACTION, WIDTH = 1200, 3, 4, 0.96, 16  # 4,800 of the 5,000 COURSE_FAST images // batch 4
STEPS = EPOCH_STEPS * EPOCHS
ARGS = ["--model", "tiny", "--width", str(WIDTH), "--batch-size", str(BATCH), "--data-fraction", str(FRACTION),
        "--epochs", str(EPOCHS), "--warmup-steps", "5", "--lr", "3e-3", "--log-every", "10", "--ckpt-every-seconds",
        "0", "--no-progress", "--amp", "off", "--device", "cpu", "--hang-timeout", "0", "--sample-ledger"]
DIVISORS = [k for k in range(1, EPOCH_STEPS + 1) if EPOCH_STEPS % k == 0]
SAVE_EVERY = 1  # the runs that measure C save after every step, the grid's densest rate: 3,597 extra saves
EXTRA_SAVES = STEPS // SAVE_EVERY - EPOCHS  # the epoch-end saves happen in every mode
MODES = {"no saves": ["--ckpt-every-steps", "0"], "sync saves": ["--ckpt-every-steps", str(SAVE_EVERY)],
         "async saves": ["--ckpt-every-steps", str(SAVE_EVERY), "--async-ckpt"]}
TOLERANCE, MIN_KILLS, POLL_S, HORIZON_S = 0.15, 20, 0.02, 3600.0


def mtbf_rule(work_s: float, epochs: int = EPOCHS) -> float:
    """M: 1.2 epochs of ``work_s``, whole seconds, at least 6: a kill costs the epoch-end-only interval much work."""
    return max(6.0, round(1.2 * work_s / epochs))


def kill_times(seed: int, mtbf_s: float, horizon_s: float) -> list[float]:
    """Seconds after the job's first start at which it is preempted: a Poisson process of rate 1/M, seeded."""
    rng, t, times = random.Random(seed), 0.0, []
    while t < horizon_s:
        t += rng.expovariate(1 / mtbf_s)
        times.append(t)
    return times


def run_process(command: list[str], out: Path, env: dict, log, job_start: float, kills: list[float]) -> dict:
    """One process of a job, killed at the first of ``kills`` (the job's clock) that falls while it runs."""
    ledger = out / "sample_ledger.jsonl"
    size = ledger.stat().st_size if ledger.exists() else 0
    since = time.monotonic() - job_start
    pending = [k for k in kills if k > since]
    proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    first = None
    while proc.poll() is None:
        now = time.monotonic()
        if first is None and ledger.exists() and ledger.stat().st_size > size:
            first = now - job_start - since
        if pending and now - job_start >= pending[0]:
            proc.kill()  # a preemption: SIGKILL, no warning, nothing saved
            proc.wait()
            return {"start_s": since, "first_step_s": first, "killed_at_s": pending[0], "code": None}
        time.sleep(POLL_S)
    return {"start_s": since, "first_step_s": first, "killed_at_s": None, "code": proc.returncode}


def first_starts(runs: list[dict]) -> list[float]:
    """Each run's time from its first start to its first step (a run killed before one is left out)."""
    return [x["starts"][0]["first_step_s"] for x in runs if x["starts"][0]["first_step_s"] is not None]


def restart_times(jobs: list[dict]) -> list[float]:
    """Seconds from each kill to the restarted process's first step (runs made before cc7efc5, kept in
    preemption_one_epoch/ and preemption_two_epochs/: from the restarted process's start)."""
    return [s["first_step_s"] + s["start_s"] - k["killed_at_s"] if "start_s" in s else s["first_step_s"]
            for x in jobs for k, s in zip(x["starts"], x["starts"][1:]) if s["first_step_s"] is not None]


def run_job(out: Path, extra: list[str], kills: list[float], env: dict, timeout_s: float) -> dict:
    """Run the script in ``out`` until it exits 0, SIGKILLed at ``kills`` and restarted with --resume each time."""
    command = [sys.executable, str(SCRIPT), "--out", str(out), *ARGS, *extra, "--resume"]
    starts: list[dict] = []
    with open(out.parent / f"{out.name}.log", "a", encoding="utf-8") as log:
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            starts.append(run_process(command, out, env, log, start, kills))
            if starts[-1]["killed_at_s"] is not None:
                continue
            if starts[-1]["code"] != 0:
                raise RuntimeError(f"{out.name}: exit code {starts[-1]['code']}, see {log.name}")
            return {"wall_s": time.monotonic() - start, "kills": len(starts) - 1, "starts": starts}
    raise RuntimeError(f"{out.name}: not finished after {timeout_s:.0f} s ({len(starts) - 1} kills)")


def keep_busy(out: Path, env: dict, done: threading.Event) -> None:
    """Until ``done``, the script unmeasured in a freed slot: else the last job runs alone and, beside hogs, faster
    than the inputs assume (2026-12-06 08:15: a restart of 4.4 s against R = 6.4 s missed a kill its replay met)."""
    command = [sys.executable, str(SCRIPT), "--out", str(out), *ARGS, "--ckpt-every-steps", "0"]
    while not done.is_set():
        shutil.rmtree(out, ignore_errors=True)
        proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and not done.wait(POLL_S):
            pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def prephase(tmp: Path, env: dict, streams: int, log) -> dict:
    """``streams`` side by side: R's parts, then each stream the three MODES in its own order (module docstring, 1.)."""
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}

    def stream(r: int) -> None:
        for mode in list(MODES)[r % 3:] + list(MODES)[:r % 3]:
            runs[mode].append(run_job(tmp / f"pre_{mode.replace(' ', '_')}_{r}", MODES[mode], [], env, 900))
    config = argparse.Namespace(ckpt_step=10, model="tiny", width=WIDTH, data_fraction=FRACTION, batch_size=BATCH,
                                homework=False, threads=1, device="cpu", repeats=1)
    with ThreadPoolExecutor(streams) as pool:
        tax = list(pool.map(lambda _: measure(config, env, log), range(streams)))
        list(pool.map(stream, range(streams)))
    restart = {"rows": {k: [x for m in tax for x in m["rows"][k]] for k in tax[0]["rows"]},
               "parts": [p for m in tax for p in m["parts"]], "step_s": [x for m in tax for x in m["step_s"]]}
    med = {mode: statistics.median(x["wall_s"] for x in v) for mode, v in runs.items()}
    r0 = statistics.median(first_starts([x for v in runs.values() for x in v]))
    log("  pre-phase medians: " + ", ".join(f"{m} {v:.2f}s" for m, v in med.items()) + f", first step {r0:.2f}s")
    return {"wall_s": {mode: [x["wall_s"] for x in v] for mode, v in runs.items()}, "R0": r0,
            "restart_tax": restart_tax(restart), "restart_runs": restart,
            "C_sync": (med["sync saves"] - med["no saves"]) / EXTRA_SAVES,
            "C_async": (med["async saves"] - med["no saves"]) / EXTRA_SAVES}


def choose_intervals(count: int) -> list[int]:
    """``count`` divisors of an epoch's steps spread on a log scale from 1 step to the whole epoch."""
    targets = [EPOCH_STEPS ** (i / (count - 1)) for i in range(count)] if count > 1 else [EPOCH_STEPS ** 0.5]
    chosen: list[int] = []
    for target in targets:
        ranked = sorted(DIVISORS, key=lambda k: abs(math.log(k / target)))
        chosen.append(next(k for k in ranked if k not in chosen))
    return sorted(chosen)


def model_inputs(plain: dict[str, dict[int, dict]], jobs: list[dict], mtbf: float) -> dict:
    """W, R0, R, C and the step time from the interleaved runs (module docstring, 2.); stops if they contradict."""
    seeds = sorted(plain["no saves"])
    c = statistics.median((plain["sync saves"][s]["wall_s"] - plain["no saves"][s]["wall_s"]) / EXTRA_SAVES
                          for s in seeds)
    firsts = first_starts([*plain["no saves"].values(), *plain["sync saves"].values(), *jobs])
    work = statistics.median(x["wall_s"] - x["starts"][0]["first_step_s"] - EPOCHS * c  # its epoch-end saves
                             for x in plain["no saves"].values())
    restarts = restart_times(jobs)
    r = statistics.median(restarts) - work / STEPS if restarts else float("nan")
    if not (c > 0 and work > 0 and r > 0):
        raise SystemExit(f"the inputs contradict each other, measured in the same runs: C {c:.4f} s (saves minus no "
                         f"saves, per extra save), W {work:.2f} s, R {r:.2f} s ({len(restarts)} restarts reached a "
                         f"step); load average {os.getloadavg()}: too noisy a machine for {len(seeds)} seeds")
    tau_s = young_interval(c, mtbf)
    return {"M": mtbf, "R0": statistics.median(firsts), "R": r, "W": work, "step_s": work / STEPS, "C_sync": c, "tau_s": tau_s,
            "tau_steps": tau_s / work * STEPS, "restarts_timed": len(restarts),
            "R_spread": spread(restarts) if restarts else None, "R0_spread": spread(firsts)}


def run_all(args: argparse.Namespace, intervals: list[int], mtbf: float, tmp: Path, env: dict, loads: list[float],
            log) -> tuple[dict, list[dict], dict[int, list[dict]], list[dict]]:
    """Every seed's uninterrupted runs and jobs, rotated per seed, ``args.jobs`` at a time; every run checked."""
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
            result = {"seed": seed, **run_job(out, ["--ckpt-every-steps", str(k)], kill_times(seed, mtbf, HORIZON_S),
                                              env, 1200)}
            results[k].append(result)
        else:
            result = plain[what][seed] = run_job(out, MODES[what], [], env, 1200)
        paths[job] = trajectory(out)
        shutil.rmtree(out)
        loads.append(os.getloadavg()[0])
        log(f"  seed {seed}, {what if what != 'job' else f'every {k} steps'}: {result['wall_s']:.1f} s, "
            f"{result['kills']} kills, load {loads[-1]:.2f}")
    queue, lock, left, done = list(plan), threading.Lock(), [len(plan)], threading.Event()

    def worker(w: int) -> None:
        while True:
            with lock:
                job = queue.pop(0) if queue else None
            if job is None:  # the queue is empty: keep the load of the jobs still running as it was
                return keep_busy(tmp / f"filler_{w}", env, done)
            try:
                one(job)
            finally:
                with lock:
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(worker, range(args.jobs)))
    for k in intervals:
        results[k].sort(key=lambda x: x["seed"])
    reference = paths[(1, "no saves", 0)]
    checks = [check_against(paths[job], reference, EPOCH_STEPS, EPOCHS, BATCH) for job in plan]
    return plain, [x for k in intervals for x in results[k]], results, checks


def predict(inputs: dict, tau_s: float) -> float:
    """The model's expectation E[T] for a job saving every ``tau_s`` seconds of work (module docstring)."""
    m = inputs["M"]
    return (expected_segment_time(inputs["R0"], 0, m)
            + expected_wall_time(inputs["W"], tau_s, inputs["C_sync"], inputs["R"], m))


def replays(inputs: dict, steps: int, seeds: int) -> list[float]:
    """The model on each seed's own kill times: the job's wall time for seeds 1..``seeds`` (``replay_wall_time``)."""
    return [replay_wall_time(kill_times(seed, inputs["M"], HORIZON_S), inputs["W"], inputs["step_s"] * steps,
                             inputs["C_sync"], inputs["R"], first_start_s=inputs["R0"]) for seed in range(1, seeds + 1)]


def near_best(times: dict[int, list[float]]) -> list[int]:
    """The intervals whose median time is at most the third quartile of the best (lowest median) interval."""
    medians = {k: statistics.median(v) for k, v in times.items()}
    q3 = spread(times[min(medians, key=medians.get)])["q3"]
    return [k for k in times if medians[k] <= q3]


def judge_range(inputs: dict, times: dict[int, list[float]]) -> dict:
    """Criterion (b) on ``times``: the near-best range, τ* inside it, the grid's two ends outside it."""
    near, grid = near_best(times), sorted(times)
    return {"near-best range (steps)": [min(near), max(near)],
            "tau* inside the near-best range": min(near) <= inputs["tau_steps"] <= max(near),
            "grid ends outside the near-best range": grid[0] not in near and grid[-1] not in near}


def verdicts(inputs: dict, rows: list[dict], checks: list[dict]) -> dict:
    """The criteria of the module docstring, with what decided them."""
    error = lambda key: max(abs(row[key] / row["measured"]["median"] - 1) for row in rows)  # noqa: E731
    failed = sorted({name for check in checks for name, ok in check.items() if not ok})
    kills = sum(row["kills"] for row in rows)
    return {"prediction within 15%": error("predicted_s") <= TOLERANCE, "worst prediction error": error("predicted_s"),
            "worst error of the expectation": error("expected_s"),
            **judge_range(inputs, {row["steps"]: row["wall_s"] for row in rows}),
            "exact resume after every kill": not failed, "failed checks": failed, "kills": kills,
            f"at least {MIN_KILLS} kills": kills >= MIN_KILLS, "runs checked": len(checks)}


def forecast(args: argparse.Namespace, pre: dict, log) -> tuple[float, list[int], dict]:
    """M, the intervals and the model's forecast from the pre-phase alone, said before any job runs."""
    work = statistics.median(pre["wall_s"]["no saves"]) - pre["R0"] - EPOCHS * pre["C_sync"]
    if pre["C_sync"] <= 0 or work <= 0:
        raise SystemExit(f"pre-phase: saves measured no slower than no saves (C {pre['C_sync']:.4f} s) or no work left "
                         f"(W {work:.2f} s): load average {os.getloadavg()}, too noisy to forecast")
    mtbf = args.mtbf or mtbf_rule(work)
    inputs = {"M": mtbf, "W": work, "step_s": work / STEPS, "C_sync": pre["C_sync"], "R": pre["restart_tax"]["R"],
              "R0": pre["R0"]}
    inputs["tau_steps"] = young_interval(inputs["C_sync"], mtbf) / inputs["step_s"]
    intervals = choose_intervals(args.intervals)
    times = {k: replays(inputs, k, args.seeds) for k in intervals}
    told = {"inputs": inputs, "expected_s": {k: predict(inputs, inputs["step_s"] * k) for k in intervals},
            "replays_s": times, **judge_range(inputs, times)}
    log(f"  M {mtbf:g} s, intervals {intervals} steps. Forecast (pre-phase: W {work:.2f} s, C {1e3 * pre['C_sync']:.1f} "
        f"ms, R {inputs['R']:.2f} s, R0 {inputs['R0']:.2f} s), E[T] / the seeds' replays' median: "
        + ", ".join(f"{k} steps {told['expected_s'][k]:.1f} / {statistics.median(times[k]):.1f} s" for k in intervals)
        + f"; near-best range {told['near-best range (steps)']} steps, tau* = {inputs['tau_steps']:.1f} steps inside it: "
        f"{told['tau* inside the near-best range']}, both ends of the grid outside it: "
        f"{told['grid ends outside the near-best range']}")
    return mtbf, intervals, told


def judge(args: argparse.Namespace, info: dict, raw: dict, told: dict, jobs: list[dict], checks: list[dict],
          loads: list[float]) -> int:
    """Inputs, predictions against measurements, verdicts; the table, the JSON, the plot; the exit status."""
    try:
        inputs = {**model_inputs(raw["uninterrupted"], jobs, told["inputs"]["M"]), "seeds": args.seeds,
                  "hogs": args.hogs, "jobs": args.jobs}
    except SystemExit:  # keep what was measured, outside bench/results/
        write_json("preemption", {"machine": info, "load_avg_1m": loads, "forecast": told, "measurements": raw},
                   Path(tempfile.gettempdir()) / "preemption_raw.json")
        raise
    rows = []
    for k, done in raw["jobs"].items():
        replayed, walls = replays(inputs, k, args.seeds), [x["wall_s"] for x in done]
        rows.append({"steps": k, "tau_s": inputs["step_s"] * k, "expected_s": predict(inputs, inputs["step_s"] * k),
                     "predicted_s": statistics.median(replayed), "replayed_s": replayed, "measured": spread(walls),
                     "wall_s": walls, "kills": sum(x["kills"] for x in done)})
    verdict = verdicts(inputs, rows, checks)
    conditions = (f"train_cifar_pro.py, tiny model (width {WIDTH}), COURSE_FAST=1, data fraction {FRACTION}, batch "
                  f"{BATCH}, {EPOCHS} epoch(s) of {EPOCH_STEPS} steps, 1 torch thread, fresh interpreters, {args.jobs} "
                  f"runs side by side; preemptions: SIGKILL at exponential times, mean M = {inputs['M']:g} s; "
                  f"{args.seeds} seeds x {len(rows)} intervals, the same kill times for every interval of a seed, two "
                  f"uninterrupted runs per seed interleaved with the jobs; {args.hogs} CPU hog(s) beside it; load "
                  f"average (1 min) {min(loads):.2f}-{max(loads):.2f} during the bench")
    text = report({"conditions": conditions, "epochs": EPOCHS, "save_every": SAVE_EVERY, "min_kills": MIN_KILLS},
                  inputs, raw["prephase"], told, rows, verdict)
    print("\n" + text)
    name = "preemption_hogs" if args.hogs else "preemption"
    if args.json is None:
        curve = [(inputs["step_s"] * k, predict(inputs, inputs["step_s"] * k)) for k in range(1, EPOCH_STEPS + 1)]
        plot(inputs, rows, curve, Path(__file__).resolve().parent / "results" / f"{name}.png")
    passed = all(verdict[k] for k in ("prediction within 15%", "tau* inside the near-best range",
                                      "exact resume after every kill", f"at least {MIN_KILLS} kills"))
    path = write_json(name, {"machine": info, "inputs": inputs, "restart_tax": raw["prephase"]["restart_tax"],
                             "forecast": told, "rows": rows, "verdict": verdict, "passed": passed,
                             "load_avg_1m": loads, "measurements": raw, "table": text}, args.json)
    print(f"\nJSON: {path}")
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mtbf", type=float, default=0.0,
                   help="M: mean seconds between preemptions (0: mtbf_rule, 1.2 epochs of the pre-phase's work)")
    p.add_argument("--seeds", type=int, default=9)
    p.add_argument("--intervals", type=int, default=5, help="grid points from 1 step to the whole epoch")
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
            mtbf, intervals, told = forecast(args, pre, log)
            plain, jobs, results, checks = run_all(args, intervals, mtbf, Path(tmp), env, loads, log)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    return judge(args, info, {"prephase": pre, "uninterrupted": plain, "jobs": results}, told, jobs, checks, loads)


if __name__ == "__main__":
    sys.exit(main())
