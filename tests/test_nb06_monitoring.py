"""The spike-detector exercise of 06_monitoring: the check accepts the solution and rejects wrong answers."""
import pytest

from tests.notebook_cells import exercise_pairs, run_source

from course_tools.checks.nb06_monitoring import check_find_spikes

NAME = "06_monitoring.ipynb"

FIXED_THRESHOLD = '''
import math

def find_spikes(values):
    return [i for i, v in enumerate(values) if not math.isfinite(v) or v > 3.0]
'''

GLOBAL_MEAN = '''
import numpy as np

def find_spikes(values):
    a = np.asarray(values, dtype=float)
    finite = a[np.isfinite(a)]
    limit = finite.mean() + 3 * finite.std()      # the spikes themselves are in the mean and std
    return [i for i, v in enumerate(a) if not np.isfinite(v) or v > limit]
'''

NO_ALARMS = '''
def find_spikes(values):
    return []
'''

def test_solution_passes_repeatedly(capsys):
    solution, _ = exercise_pairs(NAME)[0]
    fn = run_source(solution)["find_spikes"]
    for _ in range(20):  # the check draws fresh random curves each time
        check_find_spikes(fn)
    assert capsys.readouterr().out.count("✅") == 20


def test_stub_raises_not_implemented_and_fails_check():
    _, stub = exercise_pairs(NAME)[0]
    fn = run_source(stub)["find_spikes"]
    with pytest.raises(NotImplementedError):
        fn([1.0, 2.0])
    with pytest.raises(AssertionError, match="练习尚未完成"):
        check_find_spikes(fn)


@pytest.mark.parametrize("source", [FIXED_THRESHOLD, GLOBAL_MEAN, NO_ALARMS])
def test_wrong_answers_fail(source):
    fn = run_source(source)["find_spikes"]
    for _ in range(5):  # fail every time, not just on an unlucky draw
        with pytest.raises(AssertionError, match="期望"):
            check_find_spikes(fn)
