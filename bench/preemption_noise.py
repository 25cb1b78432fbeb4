"""How often criterion (a) of ``bench/preemption.py`` misses from timing noise alone: the model against itself.

Why: a job's wall time jumps by a restart R plus the lost work when a kill falls just before rather than just after
its end (or a save), and the median of a few seeds jumps with it when the median seed is the one on the edge. So a
correct model can miss the ±15% of criterion (a) because the measured W and R wobble by a few per cent. This bench
replays each seed's kill times through ``replay_wall_time`` twice: once with the inputs a run measured (the
prediction) and once with W, R and R0 drawn afresh for every job (seed x interval) around them with the run's own
spread, one R for all of a job's restarts (a pretend measurement), and counts the draws in which some interval misses.
It decided the bench's size (two epochs, not one; RESULTS §19), from the one-epoch runs of 2026-12-06 (commit c8d92a6),
kept in bench/results/preemption_one_epoch/.

Pitfall: the spread is a model too (normal; W's standard deviation is the population one of the uninterrupted
runs' wall times, R's and R0's come from their interquartile range); it says which sizes are fragile, not the odds of
a given run. M follows the bench's rule (0.6 W, at least 6 s) and one second either side, so ``--work-scale`` moves
M with W.

    python bench/preemption_noise.py --work-scale 1 2 --seeds 5 9     # the one-epoch runs, as if they had two epochs
    python bench/preemption_noise.py bench/results/preemption.json    # a run as stored now (two epochs)
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import format_table  # noqa: E402
from preemption import HORIZON_S, TOLERANCE, choose_intervals, kill_times  # noqa: E402

from course_utils.estimate_ckpt import replay_wall_time  # noqa: E402

ONE_EPOCH = Path(__file__).resolve().parent / "results" / "preemption_one_epoch"


def spreads(run: dict) -> dict[str, float]:
    """Standard deviations of W, R and R0 in a stored run (W's over its uninterrupted runs, the others' from IQR)."""
    walls = [x["wall_s"] for x in run["measurements"]["uninterrupted"]["no saves"].values()]
    iqr = lambda s: (s["q3"] - s["q1"]) / 1.349  # noqa: E731  (a normal's IQR is 1.349 standard deviations)
    return {"W": statistics.pstdev(walls), "R": iqr(run["inputs"]["R_spread"]), "R0": iqr(run["inputs"]["R0_spread"])}


def miss_rate(inputs: dict, sd: dict, mtbf: float, seeds: int, draws: int, seed: int = 0) -> float:
    """Share of ``draws`` pretend measurements whose seeds' median misses the prediction by more than TOLERANCE."""
    rng, misses = random.Random(seed), 0
    kills = [kill_times(s, mtbf, HORIZON_S) for s in range(1, seeds + 1)]
    grid = [inputs["step_s"] * k for k in choose_intervals(5)]
    told = [statistics.median(replay_wall_time(k, inputs["W"], tau, inputs["C_sync"], inputs["R"],
                                               first_start_s=inputs["R0"]) for k in kills) for tau in grid]
    for _ in range(draws):
        drawn = lambda key: max(0.05, rng.gauss(inputs[key], sd[key]))  # noqa: E731
        measured = [statistics.median(replay_wall_time(k, drawn("W"), tau, inputs["C_sync"], drawn("R"),
                                                       first_start_s=drawn("R0")) for k in kills) for tau in grid]
        misses += any(abs(p / m - 1) > TOLERANCE for p, m in zip(told, measured))
    return misses / draws


def sweep(run: dict, scales: list[float], seed_counts: list[int], draws: int) -> list[list]:
    """Rows (work scale, M, seeds, miss rate) for M at the bench's rule and one second either side."""
    rows, sd = [], spreads(run)
    for scale in scales:
        inputs = {**run["inputs"], "W": run["inputs"]["W"] * scale}  # K times the steps, each as long
        scaled = {**sd, "W": sd["W"] * scale ** 0.5}  # K independent stretches of work
        rule = max(6.0, round(0.6 * inputs["W"]))
        for mtbf in (rule - 1, rule, rule + 1):
            for seeds in seed_counts:
                rows.append([f"{scale:g}x", f"{mtbf:g}", seeds, f"{miss_rate(inputs, scaled, mtbf, seeds, draws):.2f}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", default=[str(ONE_EPOCH / "quiet.json"), str(ONE_EPOCH / "hogs.json")])
    p.add_argument("--work-scale", type=float, nargs="+", default=[1.0],
                   help="each job's steps times this (2: a stored run as if each job had twice its epochs)")
    p.add_argument("--seeds", type=int, nargs="+", default=[5])
    p.add_argument("--draws", type=int, default=200)
    args = p.parse_args(argv)
    for path in args.runs:
        run = json.loads(Path(path).read_text(encoding="utf-8"))
        sd, i = spreads(run), run["inputs"]
        print(f"\n{path}: {run['machine']['cpu_model']}, W {i['W']:.2f} s (sd {sd['W']:.2f}), R {i['R']:.2f} s "
              f"(sd {sd['R']:.3f}), R0 {i['R0']:.2f} s, C {1e3 * i['C_sync']:.1f} ms, M {i['M']:g} s")
        print(format_table(sweep(run, args.work_scale, args.seeds, args.draws),
                           ["work", "M (s)", "seeds", "share of draws missing (a)"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
