"""The notebook 04 exercise check passes on the solution and fails on the stub and on typical wrong answers.

Each wrong answer is a plausible learner mistake (commented). The check must fail on every
one with its default seed and, in the slow sweep, with 50 other seeds.
"""
from __future__ import annotations

import copy

import pytest

from course_tools.checks import CheckFailed
from course_tools.checks.nb04_checkpoint_resume import check_resume_equivalence
from tests.notebook_cells import answer_lines_in, authored_code_lines, exercise_pairs, run_source, stub_hints
from tests.sweep import failure_twice

NAME = "04_checkpoint_resume.ipynb"

_SAVE_ALL = '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step, "rng": rng_state()}, path)
'''
_HEADER = '''
import random
import numpy as np
import torch
from course_utils.repro import rng_state, set_rng_state
'''

# name -> (source, a fragment the failure message must contain)
WRONG = {
    # the chapter's "新手做法": weights only
    "weights only": ('''
import torch
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save(model.state_dict(), path)
def load_checkpoint(path, model, optimizer, scheduler):
    model.load_state_dict(torch.load(path, weights_only=True))
    return 0, 0
''', "epoch"),
    # forgets the optimizer: AdamW moments start from zero
    "forgets the optimizer": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "scheduler": scheduler.state_dict(), "epoch": epoch,
                "step": step, "rng": rng_state()}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); scheduler.load_state_dict(s["scheduler"]); set_rng_state(s["rng"])
    return s["epoch"], s["step"]
''', "优化器"),
    # saves the optimizer but forgets to load it back
    "saves but never loads the optimizer": (_HEADER + _SAVE_ALL + '''
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); scheduler.load_state_dict(s["scheduler"]); set_rng_state(s["rng"])
    return s["epoch"], s["step"]
''', "优化器"),
    # forgets the scheduler: warm-up starts again
    "forgets the scheduler": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                "step": step, "rng": rng_state()}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"]); set_rng_state(s["rng"])
    return s["epoch"], s["step"]
''', "last_epoch"),
    # "continues" the schedule with one extra scheduler.step() after loading: off by one
    "steps the scheduler after loading": (_HEADER + _SAVE_ALL + '''
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"]); scheduler.step()
    set_rng_state(s["rng"])
    return s["epoch"], s["step"]
''', "不要再调 scheduler.step"),
    # forgets every RNG state
    "forgets the RNG state": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"])
    return s["epoch"], s["step"]
''', "python random"),
    # the chapter's five elements taken literally: torch (and CUDA) RNG only, python and numpy forgotten
    "torch RNG only": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step,
                "rng": {"torch": torch.get_rng_state(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"]); torch.set_rng_state(s["rng"]["torch"])
    return s["epoch"], s["step"]
''', "python random"),
    # torch and python, numpy forgotten (a numpy augmentation then differs)
    "no numpy RNG": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step,
                "torch_rng": torch.get_rng_state(), "py_rng": random.getstate()}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"])
    v, internal, g = s["py_rng"]; random.setstate((v, tuple(internal), g)); torch.set_rng_state(s["torch_rng"])
    return s["epoch"], s["step"]
''', "numpy"),
    # numpy's key array saved, its position (and cached gaussian) dropped
    "numpy state without its position": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    keys = np.random.get_state()[1]
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step,
                "torch_rng": torch.get_rng_state(), "py_rng": random.getstate(),
                "np_keys": torch.from_numpy(keys.astype(np.int64))}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"])
    v, internal, g = s["py_rng"]; random.setstate((v, tuple(internal), g))
    np.random.set_state(("MT19937", s["np_keys"].numpy().astype(np.uint32), 0))
    torch.set_rng_state(s["torch_rng"])
    return s["epoch"], s["step"]
''', "numpy"),
    # restores the RNG first, then draws from it (a dropout forward pass to "warm up")
    "restores the RNG first, then draws from it": (_HEADER + _SAVE_ALL + '''
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    set_rng_state(s["rng"])
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"])
    torch.rand(1); random.random(); np.random.rand()
    return s["epoch"], s["step"]
''', "python random"),
    # np.random.get_state() stored as is: written, but not loadable with weights_only=True
    "numpy RNG stored as is": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step,
                "rng": torch.get_rng_state(), "np": np.random.get_state(), "py": random.getstate()}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=False)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"]); torch.set_rng_state(s["rng"])
    np.random.set_state(s["np"]); random.setstate(s["py"])
    return s["epoch"], s["step"]
''', "weights_only"),
    # pickles the optimizer object itself
    "saves the optimizer object": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer, "scheduler": scheduler.state_dict(),
                "epoch": epoch, "step": step, "rng": rng_state()}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=False)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"].state_dict())
    scheduler.load_state_dict(s["scheduler"]); set_rng_state(s["rng"])
    return s["epoch"], s["step"]
''', "weights_only"),
    # returns (step, epoch)
    "returns step and epoch swapped": (_HEADER + _SAVE_ALL + '''
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"]); set_rng_state(s["rng"])
    return s["step"], s["epoch"]
''', "顺序反了"),
}


def _functions(source: str):
    ns = run_source(source)
    return ns["save_checkpoint"], ns["load_checkpoint"]


def test_one_exercise_cell():
    assert len(exercise_pairs(NAME)) == 1


def test_solution_passes(capsys):
    solved, _ = exercise_pairs(NAME)[0]
    check_resume_equivalence(*_functions(solved))
    assert "✅" in capsys.readouterr().out


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


def test_stub_fails_with_not_implemented_message():
    _, stub = exercise_pairs(NAME)[0]
    save, load = _functions(stub)
    with pytest.raises(NotImplementedError):
        save(None, None, None, None, 0, 0)
    with pytest.raises(NotImplementedError):
        load(None, None, None, None)
    with pytest.raises(CheckFailed, match="练习尚未完成"):
        check_resume_equivalence(save, load)


def test_stub_hints_contain_no_line_of_the_answer():
    solution, stub = exercise_pairs(NAME)[0]
    hints = stub_hints(stub)
    assert len(hints) == 2
    for hint in hints:
        assert not answer_lines_in(hint, solution), answer_lines_in(hint, solution)


@pytest.mark.parametrize("name", list(WRONG))
def test_wrong_answers_fail(name):
    source, message = WRONG[name]
    with pytest.raises(CheckFailed, match=message):
        check_resume_equivalence(*_functions(source))


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


def test_verdict_is_deterministic():
    save, load = _functions(WRONG["torch RNG only"][0])
    failure_twice(check_resume_equivalence, save, load)


@pytest.mark.slow
def test_verdicts_do_not_depend_on_the_seed():
    solution = _functions(exercise_pairs(NAME)[0][0])
    wrong = {name: _functions(source) for name, (source, _) in WRONG.items()}
    for seed in range(1, 51):
        check_resume_equivalence(*solution, seed=seed)
        for name, fns in wrong.items():
            with pytest.raises(CheckFailed):
                check_resume_equivalence(*fns, seed=seed)


# ---------------------------------------------------------------- the notebook's text (issue 20)
def _cells(folder: str):
    import nbformat
    from tests.notebook_cells import ROOT
    return nbformat.read(ROOT / folder / NAME, as_version=4).cells


def test_learner_copy_shows_at_most_350_lines_of_code():
    import nbformat
    from tests.notebook_cells import ROOT

    lines = authored_code_lines(nbformat.read(ROOT / "notebooks" / NAME, as_version=4))
    assert lines <= 350, f"{lines} lines of code in notebooks/{NAME}: move machinery into course_tools/lab/checkpoint_resume.py"


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
