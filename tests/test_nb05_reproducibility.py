"""The set_seed exercise of 05_reproducibility: the check accepts the solution and rejects wrong answers.

Each wrong answer below is a mistake a learner plausibly makes; the check must fail on
every one of them with its default seed, and (slow sweep) with 50 other seeds too.
"""

import pytest

from course_tools.checks import CheckFailed
from course_tools.checks.nb05_reproducibility import check_set_seed
from tests.notebook_cells import answer_lines_in, exercise_pairs, run_source, stub_hints
from tests.sweep import failure_twice

NAME = "05_reproducibility.ipynb"

# name -> (source, a fragment the failure message must contain)
WRONG = {
    # forgets numpy: a hand-written numpy augmentation stays random
    "missing numpy": ('''
import random
import torch

def set_seed(seed):
    random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
''', "numpy"),
    # creates a new numpy Generator and throws it away; the global np.random is untouched
    "numpy default_rng instead of the global RNG": ('''
import random
import numpy as np
import torch

def set_seed(seed):
    random.seed(seed)
    np.random.default_rng(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
''', "default_rng"),
    # random.Random(seed) builds a separate object; the module-level random is untouched
    "random.Random(seed) instead of random.seed": ('''
import random
import numpy as np
import torch

def set_seed(seed):
    random.Random(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
''', "python random"),
    # forgets python random altogether
    "missing python random": ('''
import numpy as np
import torch

def set_seed(seed):
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
''', "python random"),
    # seeds the GPUs only (torch.cuda.manual_seed_all does not touch the CPU generator)
    "cuda only, no CPU torch": ('''
import random
import numpy as np
import torch

def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.cuda.manual_seed_all(seed)
''', "torch CPU"),
    # a constant instead of the argument: every "different seed" run is the same run
    "constant seed": ('''
import random
import numpy as np
import torch

def set_seed(seed):
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
''', "不同的数"),
    # the argument is ignored for numpy only (a copied snippet with a hard-coded 42)
    "numpy seeded with a constant": ('''
import random
import numpy as np
import torch

def set_seed(seed):
    random.seed(seed)
    np.random.seed(42)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
''', "numpy"),
    # random.seed() without an argument seeds from the clock: two calls differ
    "random.seed() without the argument": ('''
import random
import numpy as np
import torch

def set_seed(seed):
    random.seed()
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
''', "python random"),
    # seeds only the CPU generator object: GPUs are never seeded
    "CPU generator object only, no CUDA": ('''
import random
import numpy as np
import torch

def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)
''', "manual_seed_all"),
}


def _solution():
    return run_source(exercise_pairs(NAME)[0][0])["set_seed"]


def test_solution_passes(capsys):
    check_set_seed(_solution())
    assert "✅" in capsys.readouterr().out


def test_stub_raises_not_implemented_and_fails_check():
    _, stub = exercise_pairs(NAME)[0]
    fn = run_source(stub)["set_seed"]
    with pytest.raises(NotImplementedError):
        fn(0)
    with pytest.raises(CheckFailed, match="练习尚未完成"):
        check_set_seed(fn)


def test_stub_hint_contains_no_line_of_the_answer():
    solution, _ = exercise_pairs(NAME)[0]
    (hint,) = stub_hints(exercise_pairs(NAME)[0][1])
    assert not answer_lines_in(hint, solution, min_chars=0), answer_lines_in(hint, solution, min_chars=0)


@pytest.mark.parametrize("name", list(WRONG))
def test_wrong_answers_fail(name):
    source, message = WRONG[name]
    with pytest.raises(CheckFailed, match=message):
        check_set_seed(run_source(source)["set_seed"])


def test_verdict_is_deterministic():
    fn = run_source(WRONG["missing numpy"][0])["set_seed"]
    failure_twice(check_set_seed, fn)


def test_check_restores_cuda_seeding_function_and_the_learners_rng():
    import random

    import torch
    original = torch.cuda.manual_seed_all
    random.seed(5)
    expected = random.random()
    random.seed(5)
    with pytest.raises(CheckFailed):
        check_set_seed(run_source(WRONG["missing numpy"][0])["set_seed"])
    assert torch.cuda.manual_seed_all is original
    assert random.random() == expected


@pytest.mark.slow
def test_verdicts_do_not_depend_on_the_seed():
    solution = _solution()
    wrong = {name: run_source(source)["set_seed"] for name, (source, _) in WRONG.items()}
    for seed in range(1, 51):
        check_set_seed(solution, seed=seed)
        for name, fn in wrong.items():
            with pytest.raises(CheckFailed):
                check_set_seed(fn, seed=seed)


def test_one_statistics_rule():
    """Verdicts over seeds come from course_utils.stats (paired t-interval), not from max - min (issue 20)."""
    import nbformat

    from tests.notebook_cells import ROOT
    nb = nbformat.read(ROOT / "solutions" / "05_reproducibility.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "不能说 0.033 更好" not in text and "效应 > 种子间波动" not in text
    verdicts = [c for c in nb.cells if c.cell_type == "code" and "paired_comparison(" in c.source]
    assert len(verdicts) == 1 and "claim(" in verdicts[0].source
    assert "为什么配对" in text
