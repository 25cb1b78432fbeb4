"""The checks of notebook 01 (AMP) accept the solutions and reject stubs and typical wrong answers."""
from __future__ import annotations

import pytest
import torch

from course_tools.checks.nb01_amp import check_amp_train_step, check_needs_scaler
from tests.notebook_cells import exercise_pairs, run_source

NAME = "01_amp.ipynb"

# Typical mistakes in the AMP step: each is the solution with one thing changed.
_STEP_HEAD = '''
import torch
import torch.nn.functional as F

def amp_train_step(model, optimizer, scaler, x, y, max_norm, amp_dtype=torch.float16):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=amp_dtype, enabled=True):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
'''
WRONG_STEPS = {
    "clip_before_unscale": _STEP_HEAD + '''
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    return norm
''',
    "no_unscale": _STEP_HEAD + '''
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm
''',
    "forgot_update": _STEP_HEAD + '''
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    return norm
''',
    "optimizer_step_bypasses_scaler": _STEP_HEAD + '''
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scaler.update()
    return norm
''',
    "returns_post_clip_norm": _STEP_HEAD + '''
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    scaler.step(optimizer)
    scaler.update()
    return norm
''',
    "no_autocast": '''
import torch
import torch.nn.functional as F

def amp_train_step(model, optimizer, scaler, x, y, max_norm, amp_dtype=torch.float16):
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm
''',
    "no_zero_grad": '''
import torch
import torch.nn.functional as F

def amp_train_step(model, optimizer, scaler, x, y, max_norm, amp_dtype=torch.float16):
    with torch.autocast(device_type=x.device.type, dtype=amp_dtype, enabled=True):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm
''',
}

WRONG_NEEDS_SCALER = {
    "bf16_too": "import torch\ndef needs_scaler(dtype):\n    return dtype in (torch.float16, torch.bfloat16)\n",
    "any_16_bit": "import torch\ndef needs_scaler(dtype):\n    return torch.finfo(dtype).bits <= 16\n",
    "always": "def needs_scaler(dtype):\n    return True\n",
    "never": "def needs_scaler(dtype):\n    return False\n",
}


@pytest.fixture(scope="module")
def pairs():
    found = exercise_pairs(NAME)
    assert len(found) == 2
    return found


def test_amp_step_solution_passes(pairs, capsys):
    solution, _ = pairs[0]
    check_amp_train_step(run_source(solution)["amp_train_step"])
    assert "✅" in capsys.readouterr().out


def test_amp_step_stub_fails(pairs):
    _, stub = pairs[0]
    assert "raise NotImplementedError" in stub
    with pytest.raises(AssertionError, match="练习尚未完成"):
        check_amp_train_step(run_source(stub)["amp_train_step"])


@pytest.mark.parametrize("name", sorted(WRONG_STEPS))
def test_amp_step_wrong_answers_fail(name):
    with pytest.raises(AssertionError, match="期望"):
        check_amp_train_step(run_source(WRONG_STEPS[name])["amp_train_step"])


def test_amp_step_constant_return_fails():
    with pytest.raises(AssertionError):
        check_amp_train_step(lambda *args, **kwargs: 1.0)


def test_amp_step_messages_point_at_the_mistake():
    with pytest.raises(AssertionError, match="unscale_"):
        check_amp_train_step(run_source(WRONG_STEPS["clip_before_unscale"])["amp_train_step"])
    with pytest.raises(AssertionError, match="scaler.update"):
        check_amp_train_step(run_source(WRONG_STEPS["forgot_update"])["amp_train_step"])
    with pytest.raises(AssertionError, match="NaN/inf"):
        check_amp_train_step(run_source(WRONG_STEPS["optimizer_step_bypasses_scaler"])["amp_train_step"])


def test_amp_step_check_leaves_no_device_warnings(pairs, recwarn):
    solution, _ = pairs[0]
    check_amp_train_step(run_source(solution)["amp_train_step"])
    assert not [w for w in recwarn if "GradScaler" in str(w.message) or "autocast" in str(w.message)]


def test_needs_scaler_solution_passes(pairs, capsys):
    solution, _ = pairs[1]
    fn = run_source(solution)["needs_scaler"]
    check_needs_scaler(fn)
    assert "✅" in capsys.readouterr().out
    assert fn(torch.float16) is True


def test_needs_scaler_stub_fails(pairs):
    _, stub = pairs[1]
    with pytest.raises(AssertionError, match="练习尚未完成"):
        check_needs_scaler(run_source(stub)["needs_scaler"])


@pytest.mark.parametrize("name", sorted(WRONG_NEEDS_SCALER))
def test_needs_scaler_wrong_answers_fail(name):
    with pytest.raises(AssertionError, match="期望"):
        check_needs_scaler(run_source(WRONG_NEEDS_SCALER[name])["needs_scaler"])


def test_helper_agrees_with_the_solution(pairs):
    from course_utils.amp import needs_grad_scaler

    fn = run_source(pairs[1][0])["needs_scaler"]
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        assert bool(fn(dtype)) == needs_grad_scaler(dtype)
