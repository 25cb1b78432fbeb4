"""Notebook 04 (checkpoint and resume): what is special to its check (the four generators saved, the learner's
generators and threads left alone, each part of the state really matters) and its text. The contract (solution
passes, stub fails, hints, every typical wrong answer of tests/support/wrong_answers/nb04.py fails with its fragment) is in tests/test_exercise_contracts.py, its
50-seed sweep in tests/test_exercise_sweeps.py.
"""
from __future__ import annotations

import copy

import pytest

from course_tools.checks.nb04_checkpoint_resume import check_resume_equivalence
from tests.support.notebook_cells import authored_code_lines, exercise_pairs, run_source

NAME = "04_checkpoint_resume.ipynb"


def _functions(source: str):
    ns = run_source(source)
    return ns["save_checkpoint"], ns["load_checkpoint"]


def test_solution_saves_all_four_generators():
    """The discipline box says "all RNG states": the reference answer must save the four generators."""
    import tempfile
    from pathlib import Path

    import torch

    from course_tools.checks import nb04_checkpoint_resume as m
    save, _ = _functions(exercise_pairs(NAME)[0][0])
    model, opt, sched = m._build(0, 10)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.pt"
        save(path, model, opt, sched, 0, 0)
        state = torch.load(path, weights_only=True)
    assert set(state["rng"]) >= {"python", "numpy", "torch", "cuda"}


def test_check_leaves_the_learners_generators_and_threads_alone():
    import random

    import numpy as np
    import torch
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(())))
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    threads = torch.get_num_threads()
    check_resume_equivalence(*_functions(exercise_pairs(NAME)[0][0]))
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == expected
    assert torch.get_num_threads() == threads


@pytest.fixture
def one_thread():
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny MLP steps: on a busy 2-core box extra threads only wait for each other
    yield
    torch.set_num_threads(threads)


def test_wrong_answers_would_change_the_losses(one_thread):
    """Beyond the diagnostics: without the optimizer, the scheduler or any one generator the losses really differ."""
    import random

    import numpy as np
    import torch

    from course_tools.checks import nb04_checkpoint_resume as m

    x, y = torch.randn(128, 12), torch.randint(0, 4, (128,))
    parts = ("optimizer", "scheduler", "python", "numpy", "torch")
    for missing in parts:
        random.seed(0)
        np.random.seed(0)
        model, opt, sched = m._build(1, 20)
        m._train(model, opt, sched, x, y, 6)
        saved = {"model": copy.deepcopy(model.state_dict()), "optimizer": copy.deepcopy(opt.state_dict()),
                 "scheduler": sched.state_dict(), "generators": m._generators()}
        reference = m._train(model, opt, sched, x, y, 6)
        model2, opt2, sched2 = m._build(2, 20)
        random.seed(7)
        np.random.seed(8)
        torch.manual_seed(9)
        model2.load_state_dict(saved["model"])
        if missing != "optimizer":
            opt2.load_state_dict(saved["optimizer"])
        if missing != "scheduler":
            sched2.load_state_dict(saved["scheduler"])
        py, npy, tch = saved["generators"]
        if missing != "python":
            random.setstate(py)
        if missing != "numpy":
            np.random.set_state(npy)
        if missing != "torch":
            torch.set_rng_state(tch)
        resumed = m._train(model2, opt2, sched2, x, y, 6)
        assert max(abs(a - b) for a, b in zip(resumed, reference)) > 1e-5, missing


# ---------------------------------------------------------------- the notebook's text (issue 20)
def _cells(folder: str):
    import nbformat
    from tests.support.notebook_cells import ROOT
    return nbformat.read(ROOT / folder / NAME, as_version=4).cells


def test_learner_copy_shows_at_most_385_lines_of_code():
    """350 until issue 54 ran the real peft in §7 beside the plain-PyTorch LoRA (the library's calls are the lesson);
    360 until issue 51 ran the resume doctor in §9 (its command line, typed out, is the lesson: 23 lines)."""
    import nbformat
    from tests.support.notebook_cells import ROOT

    lines = authored_code_lines(nbformat.read(ROOT / "notebooks" / NAME, as_version=4))
    assert lines <= 385, f"{lines} lines of code in notebooks/{NAME}: move machinery into course_tools/lab/checkpoint_resume.py"


def test_the_numpy_state_is_described_honestly():
    """It loads with weights_only=False (a trusted file); only the default weights_only=True refuses it."""
    cells = _cells("solutions")
    assert not any("读不回来" in c.source for c in cells), "a numpy RNG state saved with torch.save can be read back"
    demo = [c.source for c in cells if c.cell_type == "code" and "np.random.get_state()" in c.source]
    assert demo and "weights_only=False" in demo[0] and "claim(" in demo[0]
    prose = next(c.source for c in cells if c.cell_type == "markdown" and "np.random.get_state()" in c.source)
    assert "weights_only=False" in prose and "safe_globals" in prose and "默认" in prose


def test_the_ablation_verdicts_come_from_the_one_paired_rule():
    ablation = next(c.source for c in _cells("solutions") if c.cell_type == "code" and "MISSING = " in c.source)
    assert ablation.count("paired_comparison(") == 4 and ablation.count(".verdict") >= 1
    assert ablation.count("claim(") == 3 and "statistics.median" not in ablation


def test_the_introduction_says_that_run_all_stops_at_an_unfinished_check():
    assert "Run All" in _cells("notebooks")[0].source
