"""The notebook 04 exercise check passes on the solution and fails on the stub and on typical wrong answers."""
from __future__ import annotations

import pytest

from course_tools.checks.nb04_checkpoint_resume import check_resume_equivalence
from tests.notebook_cells import exercise_pairs, run_source

NAME = "04_checkpoint_resume.ipynb"

# Each wrong answer forgets one of the five elements (or returns the wrong position).
WRONG = {
    "forgets the optimizer": '''
import torch
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "scheduler": scheduler.state_dict(), "epoch": epoch,
                "step": step, "rng": torch.get_rng_state()}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); scheduler.load_state_dict(s["scheduler"]); torch.set_rng_state(s["rng"])
    return s["epoch"], s["step"]
''',
    "forgets the scheduler": '''
import torch
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                "step": step, "rng": torch.get_rng_state()}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"]); torch.set_rng_state(s["rng"])
    return s["epoch"], s["step"]
''',
    "forgets the RNG state": '''
import torch
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"])
    return s["epoch"], s["step"]
''',
    "weights only": '''
import torch
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save(model.state_dict(), path)
def load_checkpoint(path, model, optimizer, scheduler):
    model.load_state_dict(torch.load(path, weights_only=True))
    return 0, 0
''',
    "restores the RNG first, then draws from it": '''
import torch
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step, "rng": torch.get_rng_state()}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    torch.set_rng_state(s["rng"])
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"])
    torch.rand(1)  # e.g. a warm-up forward pass with dropout after restoring
    return s["epoch"], s["step"]
''',
    "saves the numpy RNG as is (not loadable with weights_only=True)": '''
import numpy as np, torch
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step,
                "rng": torch.get_rng_state(), "np": np.random.get_state()}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=False)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"]); torch.set_rng_state(s["rng"])
    return s["epoch"], s["step"]
''',
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


def test_stub_fails_with_not_implemented_message():
    _, stub = exercise_pairs(NAME)[0]
    save, load = _functions(stub)
    with pytest.raises(NotImplementedError):
        save(None, None, None, None, 0, 0)
    with pytest.raises(NotImplementedError):
        load(None, None, None, None)
    with pytest.raises(AssertionError, match="练习尚未完成"):
        check_resume_equivalence(save, load)


@pytest.mark.parametrize("name", list(WRONG))
def test_wrong_answers_fail(name):
    with pytest.raises(AssertionError, match="期望"):
        check_resume_equivalence(*_functions(WRONG[name]))


def test_wrong_answers_would_change_the_losses():
    """Beyond the diagnostics: without the optimizer, scheduler or RNG the resumed losses really differ."""
    import torch

    from course_tools.checks import nb04_checkpoint_resume as m

    x, y = torch.randn(128, 12), torch.randint(0, 4, (128,))
    for keep in ({"scheduler", "rng"}, {"optimizer", "rng"}, {"optimizer", "scheduler"}):
        model, opt, sched = m._build(1, 20)
        m._train(model, opt, sched, x, y, 6)
        saved = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                 "optimizer": __import__("copy").deepcopy(opt.state_dict()),
                 "scheduler": sched.state_dict(), "rng": torch.get_rng_state()}
        reference = m._train(model, opt, sched, x, y, 6)
        model2, opt2, sched2 = m._build(2, 20)
        torch.manual_seed(3)
        model2.load_state_dict(saved["model"])
        if "optimizer" in keep:
            opt2.load_state_dict(saved["optimizer"])
        if "scheduler" in keep:
            sched2.load_state_dict(saved["scheduler"])
        if "rng" in keep:
            torch.set_rng_state(saved["rng"])
        resumed = m._train(model2, opt2, sched2, x, y, 6)
        assert max(abs(a - b) for a, b in zip(resumed, reference)) > 1e-5, keep
