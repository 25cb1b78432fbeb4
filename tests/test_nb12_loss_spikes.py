"""The diagnosis exercise of 12_loss_spikes: the check accepts the solution and rejects wrong answers.

Each wrong answer is a plausible learner mistake (commented); the check must fail on every one
with its default seed and, in the slow sweep, with 50 other seeds. The case generator is tested
too: the reference rule names the cause each case was built with.
"""

import pytest

from course_tools.checks import CheckFailed
from course_tools.checks.nb12_loss_spikes import CAUSES, check_cases, check_diagnose, reference_cause
from tests.notebook_cells import answer_lines_in, exercise_pairs, run_source, stub_hints
from tests.sweep import SWEEP_SEEDS, failure_twice

NAME = "12_loss_spikes.ipynb"

_ALARM = '''
import math, statistics

def _alarm(records, window=20, ratio=3.0):
    for i, r in enumerate(records):
        if not (math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])):
            return i
        if i < window // 2:
            continue
        for key in ("loss", "grad_norm"):
            past = [q[key] for q in records[max(0, i - window):i] if math.isfinite(q[key])]
            if past and r[key] > ratio * statistics.median(past):
                return i
    return len(records) - 1

def _bad_batch(records, t, window=20):
    before = records[max(0, t - window):t]
    std = statistics.median(r["batch_std"] for r in before)
    mean = statistics.median(r["batch_mean"] for r in before)
    return not (std / 3 < records[t]["batch_std"] < 3 * std) or abs(records[t]["batch_mean"] - mean) > 3 * std
'''

WRONG = {
    # looks at the smoothed loss only: a rise that lasts is "lr", a NaN is "numerics", else "data"
    "smoothed loss only": '''
import math, statistics

def diagnose_spike(records, window=20):
    smooth, s = [], None
    for r in records:
        s = r["loss"] if s is None else 0.9 * s + 0.1 * r["loss"]
        smooth.append(s)
    if any(not math.isfinite(v) for v in smooth):
        return "numerics"
    base = statistics.median(smooth[:window])
    high = [v > 1.5 * base for v in smooth]
    return "lr" if sum(high) >= 5 else "data"
''',
    # blames the lr for every grad-norm spike, a single bad batch included
    "grad-norm spike means lr": _ALARM + '''
def diagnose_spike(records, window=20):
    t = _alarm(records, window)
    r = records[t]
    if not (math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])):
        return "numerics"
    return "lr"
''',
    # ignores non-finite steps: NaN/inf compared like numbers (never above the median), the median poisoned
    "ignores non-finite steps": '''
import statistics

def diagnose_spike(records, window=20):
    for i in range(window, len(records)):
        past = records[i - window:i]
        if records[i]["loss"] > 3 * statistics.median(q["loss"] for q in past):
            std = statistics.median(q["batch_std"] for q in past)
            if not (std / 3 < records[i]["batch_std"] < 3 * std):
                return "data"
            return "lr"
    return "data"
''',
    # every NaN/inf is numerics, even one that an lr blow-up or a bad batch led to
    "non-finite always means numerics": _ALARM + '''
def diagnose_spike(records, window=20):
    import math
    if any(not (math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])) for r in records):
        return "numerics"
    t = _alarm(records, window)
    return "data" if _bad_batch(records, t, window) else "lr"
''',
    # the batch statistics only: abnormal batch -> data, anything else -> lr
    "batch statistics only": _ALARM + '''
def diagnose_spike(records, window=20):
    t = _alarm(records, window)
    return "data" if _bad_batch(records, t, window) else "lr"
''',
    # the lr changed inside the records -> lr (a warm-up or a cosine changes it every step)
    "any lr change means lr": _ALARM + '''
def diagnose_spike(records, window=20):
    if records[-1]["lr"] != records[0]["lr"]:
        return "lr"
    t = _alarm(records, window)
    if _bad_batch(records, t, window):
        return "data"
    return "numerics" if not math.isfinite(records[t]["loss"] + records[t]["grad_norm"]) else "lr"
''',
    # one-step spike -> data, longer trouble -> lr, non-finite -> numerics (no batch statistics, no precursor)
    "spike length decides": _ALARM + '''
def diagnose_spike(records, window=20):
    t = _alarm(records, window)
    r = records[t]
    if not (math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])):
        return "numerics"
    base = statistics.median(q["loss"] for q in records[max(0, t - window):t])
    after = [q for q in records[t + 1:t + 6] if math.isfinite(q["loss"]) and q["loss"] > 1.5 * base]
    return "lr" if len(after) >= 3 else "data"
''',
    # the right rule, but never looks at the grad-norm precursor (only at the logged lr)
    "no grad-norm precursor": _ALARM + '''
def diagnose_spike(records, window=20):
    t = _alarm(records, window)
    if _bad_batch(records, t, window):
        return "data"
    before = records[max(0, t - window):t]
    if records[t]["lr"] > 2 * statistics.median(q["lr"] for q in before):
        return "lr"
    r = records[t]
    return "numerics" if not (math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])) else "data"
''',
    # the right rule, but only the loss is checked for NaN/inf (an inf grad norm under a finite loss is missed)
    "loss-only finiteness": '''
import math, statistics

def diagnose_spike(records, window=20):
    for t, r in enumerate(records):
        if not math.isfinite(r["loss"]):
            break
        if t >= window // 2:
            past = [q["loss"] for q in records[max(0, t - window):t] if math.isfinite(q["loss"])]
            if r["loss"] > 3 * statistics.median(past):
                break
    before = records[max(0, t - window):t]
    std = statistics.median(q["batch_std"] for q in before)
    if not (std / 3 < records[t]["batch_std"] < 3 * std):
        return "data"
    return "numerics" if not math.isfinite(records[t]["loss"]) else "lr"
''',
    # answers in Chinese instead of the three codes
    "Chinese labels": '''
def diagnose_spike(records, window=20):
    return "坏数据"
''',
}


def _solution():
    return run_source(exercise_pairs(NAME)[0][0])["diagnose_spike"]


def test_solution_passes(capsys):
    check_diagnose(_solution())
    assert "✅" in capsys.readouterr().out


def test_solution_agrees_with_the_reference():
    fn = _solution()
    for case in check_cases():
        assert fn(case["records"]) == reference_cause(case["records"]) == case["cause"], case["name"]


def test_stub_raises_not_implemented_and_fails_check():
    fn = run_source(exercise_pairs(NAME)[0][1])["diagnose_spike"]
    with pytest.raises(NotImplementedError):
        fn([])
    with pytest.raises(CheckFailed, match="练习尚未完成"):
        check_diagnose(fn)


def test_stub_hint_contains_no_line_of_the_answer():
    solution, _ = exercise_pairs(NAME)[0]
    (hint,) = stub_hints(exercise_pairs(NAME)[0][1])
    assert not answer_lines_in(hint, solution), answer_lines_in(hint, solution)
    assert not any(f"'{c}'" in hint or f'"{c}"' in hint for c in CAUSES)


@pytest.mark.parametrize("name", list(WRONG))
def test_wrong_answers_fail(name):
    with pytest.raises(CheckFailed):
        check_diagnose(run_source(WRONG[name])["diagnose_spike"])


def test_targeted_hints():
    with pytest.raises(CheckFailed) as info:
        check_diagnose(run_source(WRONG["grad-norm spike means lr"])["diagnose_spike"])
    assert "batch 统计量" in info.value.hint
    with pytest.raises(CheckFailed) as info:
        check_diagnose(run_source(WRONG["Chinese labels"])["diagnose_spike"])
    assert "'data'" in info.value.expected


def test_designed_cases_have_the_causes_they_were_built_with():
    for seed in [1234, *range(1, 51)]:
        cases = check_cases(seed)
        assert {c["cause"] for c in cases} == set(CAUSES)
        for case in cases:
            assert reference_cause(case["records"]) == case["cause"], (seed, case["name"])


def test_check_does_not_let_the_learner_edit_the_cases():
    def vandal(records):
        records.clear()
        return "data"
    with pytest.raises(CheckFailed):
        check_diagnose(vandal)
    assert check_cases()[0]["records"]


def test_verdict_is_deterministic():
    failure_twice(check_diagnose, run_source(WRONG["smoothed loss only"])["diagnose_spike"])


@pytest.mark.slow
def test_verdicts_do_not_depend_on_the_seed():
    solution = _solution()
    wrong = {name: run_source(source)["diagnose_spike"] for name, source in WRONG.items()}
    for seed in SWEEP_SEEDS:
        check_diagnose(solution, seed=seed)
        for name, fn in wrong.items():
            with pytest.raises(CheckFailed):
                check_diagnose(fn, seed=seed)
