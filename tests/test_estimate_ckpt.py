"""course_utils.estimate_ckpt: the expected wall time of a preempted job, Young's and Daly's interval (issue 53).

The closed form is checked against a simulation of its own assumptions (exponential preemptions striking work,
saves and restarts alike), the intervals against the exact optimum, and every input is refused when it is no
time at all. The bench that checks it against real kills is bench/preemption.py.
"""
from __future__ import annotations

import math
import random
import subprocess
import sys

import pytest

from course_utils.estimate_ckpt import (IntervalTuner, daly_interval, expected_run, expected_segment_time,
                                        expected_wall_time, optimal_interval, replay_wall_time, young_interval)


def simulate(work: float, interval: float, save: float, restart: float, mtbf: float, rng: random.Random) -> float:
    """One job under the model's assumptions, event by event: its wall time."""
    t, done, next_failure, restarting = 0.0, 0.0, rng.expovariate(1 / mtbf), False
    while done < work - 1e-9:
        need = (restart if restarting else 0.0) + interval + save
        if t + need <= next_failure:
            t, done, restarting = t + need, done + interval, False
        else:  # preempted: the segment (and a restart in progress) is lost
            t, next_failure, restarting = next_failure, next_failure + rng.expovariate(1 / mtbf), True
    return t


@pytest.mark.parametrize("work, interval, save, restart, mtbf", [(100, 10, 2, 5, 30), (60, 20, 0.5, 10, 15),
                                                                  (500, 50, 5, 0, 200)])
def test_closed_form_equals_a_simulation_of_its_assumptions(work, interval, save, restart, mtbf):
    rng = random.Random(0)
    runs = [simulate(work, interval, save, restart, mtbf, rng) for _ in range(10_000)]
    mean = sum(runs) / len(runs)
    sem = (sum((x - mean) ** 2 for x in runs) / (len(runs) - 1)) ** 0.5 / len(runs) ** 0.5
    assert abs(mean - expected_wall_time(work, interval, save, restart, mtbf)) < 4 * sem


@pytest.mark.parametrize("work, interval, save, restart, first, mtbf", [(12, 0.24, 0.012, 4, 4, 12),
                                                                         (12, 12, 0.012, 4, 4, 12), (100, 10, 2, 5, 0, 30)])
def test_replays_through_poisson_schedules_average_to_the_closed_form(work, interval, save, restart, first, mtbf):
    """bench/preemption.py predicts each killed run with the replay: its mean is the model's expectation."""
    rng, runs = random.Random(1), []
    for _ in range(10_000):
        kills, t = [], 0.0
        while t < 60 * mtbf:
            t += rng.expovariate(1 / mtbf)
            kills.append(t)
        runs.append(replay_wall_time(kills, work, interval, save, restart, first_start_s=first))
    mean = sum(runs) / len(runs)
    sem = (sum((x - mean) ** 2 for x in runs) / (len(runs) - 1)) ** 0.5 / len(runs) ** 0.5
    expected = expected_segment_time(first, 0, mtbf) + expected_wall_time(work, interval, save, restart, mtbf)
    assert abs(mean - expected) < 4 * sem


@pytest.mark.parametrize("kills, first, expected", [
    ([], 0, 13.0),               # 10 s of work and 3 saves (4 + 4 + 2 s of work)
    ([6.0], 0, 16.0),            # saved at 5 s, killed at 6: a 2 s restart and the lost second
    ([5.0], 0, 15.0),            # killed the instant the save ends: the save counts
    ([4.5], 0, 4.5 + 2 + 13.0),  # killed during the first save: nothing saved, all the work again
    ([6.0, 7.0], 0, 7 + 2 + 8),  # the restart is killed too: another restart, nothing more lost
    ([0.5, 1.0], 2, 1 + 2 + 13.0),  # the first start killed twice: it starts over, without the restart tax
])
def test_replay_follows_each_preemption(kills, first, expected):
    assert math.isclose(replay_wall_time(kills, 10, 4, 1, 2, first_start_s=first), expected)


def test_replay_takes_one_restart_cost_per_preemption():
    """bench/preemption_noise.py draws each restart from the measured ones: the i-th restart costs restart_s[i]."""
    assert math.isclose(replay_wall_time([6.0, 7.0], 10, 4, 1, [0.5, 2]), 7 + 2 + 8)  # killed again at 7: the 2nd
    assert math.isclose(replay_wall_time([6.0, 20.0], 10, 4, 1, [3, 0.5]), 6 + 3 + 8)  # only the first restart counts
    assert math.isclose(replay_wall_time([6.0], 10, 4, 1, [2]), replay_wall_time([6.0], 10, 4, 1, 2))
    with pytest.raises(ValueError, match="每次抢占各给一个"):
        replay_wall_time([6.0, 7.0], 10, 4, 1, [2])
    with pytest.raises(ValueError, match=r"restart_s\[1\]"):
        replay_wall_time([6.0, 7.0], 10, 4, 1, [2, -1])


def test_no_preemptions_in_the_limit_costs_the_work_and_the_saves():
    assert math.isclose(expected_wall_time(3600, 600, 10, 120, 1e12), 3600 + 6 * 10, rel_tol=1e-6)
    assert math.isclose(expected_segment_time(60, 0, 600), 600 * math.expm1(0.1))


def test_the_exact_optimum_minimises_and_daly_is_closer_to_it_than_young():
    for save, mtbf in [(10, 7200), (60, 3600), (300, 3600), (0.02, 20)]:
        best = optimal_interval(save, mtbf)
        cost = lambda tau: expected_wall_time(1e5, tau, save, 30, mtbf)  # noqa: E731
        assert cost(best) <= min(cost(best * 0.97), cost(best * 1.03))
        assert abs(daly_interval(save, mtbf) - best) <= abs(young_interval(save, mtbf) - best)
    assert math.isclose(young_interval(10, 7200), math.sqrt(2 * 10 * 7200))
    # where a save is a tiny part of M the three agree; at C = 5% of M Young saves over 5% too rarely
    assert math.isclose(young_interval(0.02, 20), optimal_interval(0.02, 20), rel_tol=0.02)
    assert young_interval(180, 3600) > 1.05 * optimal_interval(180, 3600)
    assert daly_interval(100, 40) == 40  # C >= 2M: Daly's rule says save every M


def test_the_restart_tax_moves_the_bill_not_the_optimum():
    taus = [10 * 1.1 ** i for i in range(60)]
    best = {r: min(taus, key=lambda t: expected_wall_time(1e4, t, 5, r, 600)) for r in (0, 60, 300)}
    assert len(set(best.values())) == 1
    assert expected_wall_time(1e4, 80, 5, 300, 600) > expected_wall_time(1e4, 80, 5, 0, 600) * math.exp(0.5) * 0.999


def test_the_chapter_example_every_hour_is_fine_with_rare_preemptions_and_costly_with_frequent_ones():
    work = 10_000 * 3 / (4 * 0.5)  # 15,000 s: the LoRA-7B example's 4.2 h
    for mtbf, worse in [(2 * 3600, 0.15), (24 * 3600, 0.0)]:
        best, hourly = expected_run(work, 10, 120, mtbf, 2.4), expected_run(work, 10, 120, mtbf, 2.4, interval_s=3600)
        assert hourly.yuan > best.yuan * (1 + worse)
    assert expected_run(work, 10, 120, 24 * 3600, 2.4, interval_s=3600).yuan < expected_run(work, 10, 120, 24 * 3600, 2.4).yuan * 1.02


def test_runaway_when_restarts_approach_the_mtbf():
    assert not expected_run(3600, 5, 60, 3600).runaway
    slow = expected_run(3600, 5, 900, 600)  # a restart longer than the mean time between preemptions
    assert slow.runaway and slow.overhead > 1 and "⚠️" in slow.summary()
    never = expected_run(10 * 3600, 0, 60, 3600, interval_s=10 * 3600)  # no checkpoint at all: e^{W/M}
    assert never.wall_s > 3600 * math.expm1(10)


@pytest.mark.parametrize("call", [lambda: young_interval(-1, 100), lambda: young_interval(1, 0),
                                  lambda: daly_interval(float("nan"), 100), lambda: optimal_interval(1, float("inf")),
                                  lambda: expected_wall_time(100, 0, 1, 1, 100), lambda: expected_wall_time(-5, 1, 1, 1, 100),
                                  lambda: expected_segment_time(1, -2, 100), lambda: expected_run(100, 1, 1, 100, -2.4),
                                  lambda: young_interval(True, 100), lambda: young_interval("10", 100),
                                  lambda: replay_wall_time([], 10, 0, 1, 1), lambda: replay_wall_time([], 10, 1, 1, -1),
                                  lambda: IntervalTuner(0), lambda: IntervalTuner(100).observe(-0.1)])
def test_bad_input_is_refused_in_chinese(call):
    with pytest.raises(ValueError, match="秒|应"):
        call()


def test_interval_tuner_uses_the_median_of_the_measured_saves():
    tuner = IntervalTuner(mtbf_s=3600)
    assert math.isclose(tuner.interval_s, math.sqrt(2 * 1.0 * 3600))  # the first guess: 1 s
    for seconds in (0.5, 8.0, 0.4):
        interval = tuner.observe(seconds)
    assert math.isclose(interval, young_interval(0.5, 3600))  # one slow save does not decide


def test_importing_it_loads_no_torch():
    """The professional script imports it before torch (flag validation costs milliseconds)."""
    code = "import sys, course_utils.estimate_ckpt; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_tune_saves_sets_youngs_interval_from_the_measured_saves(tmp_path):
    from course_utils.checkpoint import CheckpointManager
    from course_utils.estimate_ckpt import tune_saves

    manager = CheckpointManager(tmp_path, every_seconds=3600)
    said = []
    tuner = tune_saves(manager, mtbf_s=600, report=said.append)
    assert math.isclose(manager.every_seconds, young_interval(1.0, 600))   # before any save: the 1 s guess
    for step in (1, 2, 3):
        manager.save({"step": step}, step)
    assert len(tuner.saves) == 3 and all(s > 0 for s in tuner.saves)
    assert math.isclose(manager.every_seconds, young_interval(tuner.save_s, 600))
    assert len(said) == 1 and "auto" in said[0]
    assert (tmp_path / "step_00000003.pt").exists()


@pytest.mark.parametrize("text, value", [("auto", "auto"), ("AUTO", "auto"), ("0", 0.0), ("3600", 3600.0)])
def test_seconds_or_auto_accepts(text, value):
    from course_utils.estimate_ckpt import seconds_or_auto
    assert seconds_or_auto(text) == value


@pytest.mark.parametrize("text", ["-1", "nan", "inf", "hourly", ""])
def test_seconds_or_auto_refuses_in_chinese(text):
    import argparse

    from course_utils.estimate_ckpt import seconds_or_auto
    with pytest.raises(argparse.ArgumentTypeError, match="应为秒数"):
        seconds_or_auto(text)


# --- the professional script's --ckpt-every-seconds auto --mtbf SECONDS ---------------------------------------

@pytest.mark.parametrize("flags", [["--mtbf", "20"], ["--ckpt-every-seconds", "auto"],
                                   ["--ckpt-every-seconds", "auto", "--mtbf", "0"]])
def test_script_refuses_auto_without_mtbf_and_mtbf_without_auto(flags, tmp_path):
    from tests.support.pro_runs import SCRIPT
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "run"), *flags], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and not (tmp_path / "run").exists(), done.stderr


@pytest.mark.slow
def test_script_saves_at_youngs_interval_from_its_measured_saves(tmp_path):
    from tests.support.pro_runs import TINY, run, train_losses
    out = tmp_path / "auto"
    # M = 2 ms: Young's interval of even a 200 ms save is under 30 ms, a few steps (an epoch of 15 steps takes
    # about 0.2 s, AMD EPYC), so time-based saves happen mid-epoch. With M = 0.5 s it was 0.09 s for an 8 ms save
    # and grows with the save's time: in one CI run on a busy machine no save fell inside an epoch.
    code, output = run(out, *TINY, "--epochs", "2", "--ckpt-every-steps", "0", "--ckpt-every-seconds", "auto",
                       "--mtbf", "0.002", "--keep-last", "100", interpreter="forked")
    assert code == 0, output
    assert output.count("--ckpt-every-seconds auto:") == 1, output
    steps = sorted(int(p.name[5:13]) for p in (out / "checkpoints").glob("step_*.pt"))
    assert [s for s in steps if s % 15] and len(train_losses(out)) == 30, steps  # saves inside the epochs
