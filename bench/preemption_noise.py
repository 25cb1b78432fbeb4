"""How often criterion (a) of ``bench/preemption.py`` misses from timing noise alone: the model against itself.

Why: a job's wall time jumps by a restart R plus the lost work when a kill falls just before rather than just after
its end (or a save), and the median of a few seeds jumps with it when the median seed is the one on the edge. So a
correct model can miss the ±15% of criterion (a) because the measured W, C and R wobble by a few per cent. This bench
replays each seed's kill times through ``replay_wall_time`` twice: once with the medians a run measured (the
prediction), and once with every input drawn from that run's own measurements (a pretend measurement): W and C for
each job from its uninterrupted runs, a first start from its first starts, every restart from its restarts, tails
included. It counts the draws in which some interval misses by over 15%, for the bench's own seeds 1..N at M by the
bench's rule (``mtbf_rule``: 1.2 epochs of work) and one second either side, and at the run's own M; ``--work-scale``
gives each job K times the steps (W's spread grows as √K). It chose the bench's size (RESULTS §19) from the runs kept
in bench/results/ (preemption_one_epoch/, preemption_two_epochs/, preemption_three_epochs/) and reads the current
ones (preemption.json, preemption_hogs.json) by default too.

Pitfall: it knows only the spread the run measured. Real jobs exceed their replays by a little more: a median of
1.26 s in the two-epoch run (R then left out the time from a kill to the restart, a median of 0.04 s a kill), 0.3 s
and 0.55 s in the three-epoch runs. Read its shares as a floor, and as a comparison of sizes and seeds.

    python bench/preemption_noise.py                             # the stored runs, each with its own number of seeds
    python bench/preemption_noise.py bench/results/preemption_three_epochs/quiet.json --seeds 5 7 9
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
from preemption import (EPOCH_STEPS, TOLERANCE, choose_intervals, first_starts, kill_times, mtbf_rule,  # noqa: E402
                        restart_times)

from course_utils.estimate_ckpt import replay_wall_time  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
STORED = [RESULTS / "preemption_one_epoch" / "quiet.json", RESULTS / "preemption_one_epoch" / "hogs.json",
          RESULTS / "preemption_two_epochs" / "quiet.json", RESULTS / "preemption_three_epochs" / "quiet.json",
          RESULTS / "preemption.json", RESULTS / "preemption_hogs.json"]


def samples(run: dict) -> dict[str, list[float]]:
    """A stored run's measurements of each input: W and C per seed, R0 per first start, R per restart (seconds)."""
    inputs, measured = run["inputs"], run["measurements"]
    steps = round(inputs["W"] / inputs["step_s"])
    plain = measured["uninterrupted"]
    busy = {s: x["wall_s"] - x["starts"][0]["first_step_s"] for s, x in plain["no saves"].items()}
    typical = statistics.median(busy.values())
    jobs = [x for done in measured["jobs"].values() for x in done]
    return {"W": [inputs["W"] + b - typical for b in busy.values()],
            "C": [(plain["sync saves"][s]["wall_s"] - x["wall_s"]) / (steps - steps // EPOCH_STEPS)
                  for s, x in plain["no saves"].items()],
            "R0": first_starts([*plain["no saves"].values(), *plain["sync saves"].values(), *jobs]),
            "R": [r - inputs["step_s"] for r in restart_times(jobs)]}


def scaled(measured: dict[str, list[float]], scale: float) -> dict[str, list[float]]:
    """The samples as if every job had ``scale`` times the steps: W's deviations grow as √scale, the rest stay."""
    middle = statistics.median(measured["W"])
    return {**measured, "W": [scale * middle + (w - middle) * scale ** 0.5 for w in measured["W"]]}


def miss_rate(measured: dict[str, list[float]], step_s: float, mtbf: float, seeds: int, draws: int,
              seed: int = 0) -> float:
    """Share of ``draws`` pretend measurements whose seeds' median misses the prediction by more than TOLERANCE."""
    rng, misses = random.Random(seed), 0
    middle = {key: statistics.median(values) for key, values in measured.items()}
    horizon = 20 * (max(measured["W"]) + max(measured["R0"]))  # kills later than this never strike these jobs
    kills = [kill_times(s, mtbf, horizon) for s in range(1, seeds + 1)]
    grid = [step_s * k for k in choose_intervals(5)]
    told = [statistics.median(replay_wall_time(k, middle["W"], tau, middle["C"], middle["R"], first_start_s=middle["R0"])
                              for k in kills) for tau in grid]
    for _ in range(draws):
        drawn = [statistics.median(replay_one(k, measured, tau, rng) for k in kills) for tau in grid]
        misses += any(abs(p / m - 1) > TOLERANCE for p, m in zip(told, drawn))
    return misses / draws


def replay_one(kills: list[float], measured: dict[str, list[float]], tau: float, rng: random.Random) -> float:
    """One pretend job: W and C drawn for it, its first start and each of its restarts drawn on their own."""
    return replay_wall_time(kills, rng.choice(measured["W"]), tau, rng.choice(measured["C"]),
                            [rng.choice(measured["R"]) for _ in kills], first_start_s=rng.choice(measured["R0"]))


def sweep(run: dict, scales: list[float], seed_counts: list[int], draws: int) -> list[list]:
    """Rows (work scale, M, seeds, miss rate) for M by the bench's rule and one second either side."""
    rows, measured = [], samples(run)
    for scale in scales:
        drawn = scaled(measured, scale)
        work = statistics.median(drawn["W"])
        rule = mtbf_rule(work, round(work / run["inputs"]["step_s"] / EPOCH_STEPS))
        for mtbf in sorted({rule - 1, rule, rule + 1} | ({run["inputs"]["M"]} if scale == 1 else set())):
            for seeds in seed_counts:
                share = miss_rate(drawn, run["inputs"]["step_s"], mtbf, seeds, draws)
                rows.append([f"{scale:g}x", f"{mtbf:g}", seeds, f"{share:.2f}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", default=[str(path) for path in STORED])
    p.add_argument("--work-scale", type=float, nargs="+", default=[1.0],
                   help="each job's steps times this (1.5: a two-epoch run as if it had three)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="seed counts (default: each run's own)")
    p.add_argument("--draws", type=int, default=200)
    args = p.parse_args(argv)
    for path in args.runs:
        run = json.loads(Path(path).read_text(encoding="utf-8"))
        middle = {key: statistics.median(values) for key, values in samples(run).items()}
        print(f"\n{path}: {run['machine']['cpu_model']}, M {run['inputs']['M']:g} s; medians: W {middle['W']:.2f} s, "
              f"R {middle['R']:.2f} s, R0 {middle['R0']:.2f} s, C {1e3 * middle['C']:.1f} ms")
        print(format_table(sweep(run, args.work_scale, args.seeds or [run["inputs"]["seeds"]], args.draws),
                           ["work", "M (s)", "seeds", "share of draws missing (a)"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
