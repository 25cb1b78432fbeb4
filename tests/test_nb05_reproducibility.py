"""The set_seed exercise of 05_reproducibility: the check accepts the solution and rejects wrong answers."""
import pytest

from tests.notebook_cells import exercise_pairs, run_source

from course_tools.checks.nb05_reproducibility import check_set_seed

NAME = "05_reproducibility.ipynb"

MISSING_NUMPY = '''
import random
import torch

def set_seed(seed):
    random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
'''

NUMPY_GENERATOR_ONLY = '''
import random
import numpy as np
import torch

def set_seed(seed):
    random.seed(seed)
    np.random.default_rng(seed)   # creates a new Generator; the global np.random is untouched
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
'''

CONSTANT_SEED = '''
import random
import numpy as np
import torch

def set_seed(seed):
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
'''

NO_CUDA = '''
import random
import numpy as np
import torch

def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)   # CPU generator only
'''


def test_solution_passes(capsys):
    solution, _ = exercise_pairs(NAME)[0]
    check_set_seed(run_source(solution)["set_seed"])
    assert "✅" in capsys.readouterr().out


def test_stub_raises_not_implemented_and_fails_check():
    _, stub = exercise_pairs(NAME)[0]
    fn = run_source(stub)["set_seed"]
    with pytest.raises(NotImplementedError):
        fn(0)
    with pytest.raises(AssertionError, match="练习尚未完成"):
        check_set_seed(fn)


@pytest.mark.parametrize("source, message", [
    (MISSING_NUMPY, "numpy"),
    (NUMPY_GENERATOR_ONLY, "numpy"),
    (CONSTANT_SEED, "不同的数"),
    (NO_CUDA, "manual_seed_all"),
])
def test_wrong_answers_fail(source, message):
    with pytest.raises(AssertionError, match=message):
        check_set_seed(run_source(source)["set_seed"])


def test_check_restores_cuda_seeding_function():
    import torch
    original = torch.cuda.manual_seed_all
    with pytest.raises(AssertionError):
        check_set_seed(run_source(MISSING_NUMPY)["set_seed"])
    assert torch.cuda.manual_seed_all is original
