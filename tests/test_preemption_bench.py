"""bench/preemption.py's own logic, without running it: the grid, criterion (b) and the forecast it prints first.

The bench itself kills real runs for minutes and is run by hand (its command is in its docstring and in
bench/RESULTS.md §19). Here: the grid spans a save after every step to one an epoch; the near-best range and
criterion (b) can fail, on either side; the forecast from pre-phase inputs like the bench's expects both ends of
the grid outside the near-best range (else (b) would hold whatever the measurement); bench/preemption_noise.py
shows 7 seeds a lottery for criterion (a) at the bench's size (three epochs) and 9 seeds much less of one.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_preemption", BENCH / "preemption.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_grid_runs_from_a_save_per_step_to_the_whole_epoch(bench):
    assert bench.choose_intervals(5) == [1, 6, 40, 200, 1200]
    seven = bench.choose_intervals(7)
    assert seven[0] == 1 and seven[-1] == bench.EPOCH_STEPS == 1200 and len(set(seven)) == 7
    assert all(bench.EPOCH_STEPS % k == 0 for k in seven)  # every segment whole


def test_criterion_b_fails_when_tau_star_is_outside_the_near_best_range(bench):
    times = {1: [30.0] * 5, 24: [20.0, 21.0, 22.0, 23.0, 24.0], 120: [22.5] * 5, 600: [40.0] * 5}
    assert bench.near_best(times) == [24, 120]  # 22.5 <= Q3 of the best (23.0)
    held = bench.judge_range({"tau_steps": 30.0}, times)
    assert held == {"near-best range (steps)": [24, 120], "tau* inside the near-best range": True,
                    "grid ends outside the near-best range": True}
    assert not bench.judge_range({"tau_steps": 3.0}, times)["tau* inside the near-best range"]
    flat = {k: [20.0, 21.0, 22.0, 23.0, 24.0] for k in times}  # the old run's case: (b) cannot fail
    assert bench.judge_range({"tau_steps": 3.0}, flat)["near-best range (steps)"] == [1, 600]
    assert not bench.judge_range({"tau_steps": 3.0}, flat)["grid ends outside the near-best range"]


@pytest.mark.parametrize("step_s, save_s, restart_s, ends_out", [(0.0062, 0.0083, 3.1, True), (0.008, 0.008, 3.6, True),
                                                                   (0.010, 0.010, 4.0, True), (0.016, 0.016, 7.2, True),
                                                                   (0.008, 0.001, 3.6, False)])
def test_the_forecast_expects_both_ends_of_the_grid_outside_the_near_best_range(bench, step_s, save_s, restart_s,
                                                                                ends_out):
    """Inputs like the bench's on a 2-core AMD EPYC (TinyCNN width 16 at batch 4: a step and a save both about 6-10
    ms, R about 3-4 s; twice all of that beside 2 CPU hogs): the model itself says that saving after every step and
    saving only at epoch ends are both clearly slower for the bench's seeds, and τ* is near-best. Not with saves of 1
    ms: then the every-step end's 3,600 saves cost less than the spread a kill or two adds, and the forecast says so."""
    work = step_s * bench.STEPS
    pre = {"wall_s": {"no saves": [restart_s + work + bench.EPOCHS * save_s]}, "R0": restart_s, "C_sync": save_s,
           "restart_tax": {"R": restart_s}}
    said = []
    mtbf, intervals, told = bench.forecast(argparse.Namespace(mtbf=0.0, intervals=5, seeds=9), pre, said.append)
    assert mtbf == bench.mtbf_rule(work) == max(6, round(0.4 * work)) and intervals == [1, 6, 40, 200, 1200]
    assert told["grid ends outside the near-best range"] == ends_out and told["tau* inside the near-best range"], said
    assert "near-best range" in said[0] and all(f"{k} steps" in said[0] for k in intervals)
    expected = told["expected_s"]
    assert expected[1] > expected[40] < expected[1200]


def test_noise_alone_makes_seven_seeds_a_lottery_and_nine_much_less(bench):
    """bench/preemption_noise.py, the reason for the bench's size: each job's W and C and each start drawn afresh from
    what a run measured. The three-epoch quiet run (AMD EPYC: W 19.1 s, R 3.1 s from the kill, C 7.8 ms, M 8 s): with
    its 7 seeds the model misses itself by over 15% in many draws (seed 1's kills on the edge of a save and of its
    job's end, as in the run); with seeds 1-9, in at most 1 of 60. The two-epoch run (5e6fcfe) at its own M (9 s), 5 seeds: in some.
    """
    noise = importlib.util.module_from_spec(spec := importlib.util.spec_from_file_location(
        "bench_preemption_noise", BENCH / "preemption_noise.py"))
    spec.loader.exec_module(noise)
    runs = {n: json.loads((BENCH / "results" / f"preemption_{n}_epochs" / "quiet.json").read_text(encoding="utf-8"))
            for n in ("two", "three")}
    three, step = noise.samples(runs["three"]), runs["three"]["inputs"]["step_s"]
    assert len(three["R"]) == 142 and len(three["W"]) == len(three["C"]) == 7
    flat = {key: [statistics.median(values)] for key, values in three.items()}
    assert noise.miss_rate(flat, step, 8.0, 7, 10) == 0.0  # no noise: the model meets itself
    assert bench.mtbf_rule(statistics.median(three["W"])) == runs["three"]["inputs"]["M"] == 8
    assert noise.miss_rate(three, step, 8.0, 7, 60) > 0.1
    assert noise.miss_rate(three, step, 8.0, 9, 60) <= 1 / 60
    assert noise.miss_rate(noise.samples(runs["two"]), runs["two"]["inputs"]["step_s"], 9.0, 5, 60) > 0.05


@pytest.mark.parametrize("name", ["preemption", "preemption_hogs"])
def test_stored_inputs_follow_from_the_stored_measurements_and_the_noise_bench_reads_the_same(bench, name):
    """The JSON's W, C, R0 and R are what ``model_inputs`` computes from the runs it stores, and the noise bench's
    samples of R0 and R (``first_starts``, ``restart_times``: one computation for both benches) have those medians."""
    noise = importlib.util.module_from_spec(spec := importlib.util.spec_from_file_location(
        "bench_preemption_noise", BENCH / "preemption_noise.py"))
    spec.loader.exec_module(noise)
    run = json.loads((BENCH / "results" / f"{name}.json").read_text(encoding="utf-8"))
    measured = run["measurements"]
    plain = {mode: {int(seed): x for seed, x in runs.items()} for mode, runs in measured["uninterrupted"].items()}
    jobs = [x for k in sorted(measured["jobs"], key=int) for x in measured["jobs"][k]]
    got = bench.model_inputs(plain, jobs, run["inputs"]["M"])
    assert {k: got[k] for k in ("R0", "R", "W", "C_sync", "restarts_timed")} == {
        k: run["inputs"][k] for k in ("R0", "R", "W", "C_sync", "restarts_timed")}
    drawn = noise.samples(run)
    assert len(drawn["R"]) == got["restarts_timed"] > 100
    assert all(x["starts"][0]["first_step_s"] in drawn["R0"] for x in plain["sync saves"].values())  # all first starts
    assert statistics.median(drawn["R0"]) == got["R0"] and statistics.median(drawn["R"]) == pytest.approx(got["R"])


def test_criterion_c_catches_each_way_a_resume_can_go_wrong(bench, tmp_path):
    """preemption_checks on a ledger of 2 epochs x 3 steps x batch 2: the exact one passes every check; a replayed
    step that saw other samples, a sample seen twice in an epoch, a skipped step and a changed loss each fail theirs."""
    import preemption_checks as checks
    order = [[0, 1], [2, 3], [4, 5], [3, 0], [5, 1], [2, 4]]

    def run(name: str, ledger: list[tuple[int, list[int]]], loss_at_4: float = 0.5) -> dict:
        out = tmp_path / name
        out.mkdir()
        (out / "sample_ledger.jsonl").write_text("".join(json.dumps({"step": s, "indices": [i]}) + "\n"
                                                          for s, i in ledger))
        (out / "metrics.jsonl").write_text(json.dumps({"split": "train", "step": 4, "loss": loss_at_4}) + "\n")
        return checks.trajectory(out)

    exact = [(s + 1, order[s]) for s in range(6)]
    reference = run("reference", exact)
    verdict = lambda got: checks.check_against(got, reference, 3, 2, 2)  # noqa: E731
    assert all(verdict(run("resumed", exact[:4] + [(3, order[2])] + exact[3:])).values())  # step 3 replayed alike
    failed = {name: [k for k, ok in verdict(run(name, ledger, loss)).items() if not ok] for name, ledger, loss in [
        ("other samples on replay", exact[:3] + [(4, [5, 1])] + exact[3:], 0.5),
        ("a sample twice", exact[:3] + [(4, [3, 3])] + exact[4:], 0.5),
        ("a step skipped", exact[:4] + exact[5:], 0.5),
        ("another loss", exact, 0.25)]}
    assert failed == {"other samples on replay": ["replayed steps saw the same samples"],
                      "a sample twice": ["each sample once per epoch", "same samples as uninterrupted"],
                      "a step skipped": ["each sample once per epoch", "same samples as uninterrupted"],
                      "another loss": ["same losses as uninterrupted"]}
