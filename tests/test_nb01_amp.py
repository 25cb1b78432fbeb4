"""The checks of notebook 01 (AMP) accept the solutions and reject stubs and typical wrong answers.

Each wrong answer is a mistake a learner plausibly makes, with a fragment its failure
message must contain (the hint names the mistake). The check must fail on every one with
its default seed and, in the slow sweep, with 50 other seeds.
"""
from __future__ import annotations


import pytest
import torch

from course_tools.checks import CheckFailed
from course_tools.checks.nb01_amp import check_amp_train_step, check_needs_scaler
from tests.exercise_isolation import demo_cells_using_exercises
from tests.notebook_cells import exercise_pairs, run_source, stub_hints
from tests.sweep import SWEEP_SEEDS

NAME = "01_amp.ipynb"

_HEAD = '''
import torch
import torch.nn.functional as F

def amp_train_step(model, optimizer, scaler, x, y, max_norm, amp_dtype=torch.float16):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=amp_dtype, enabled=True):
        loss = F.cross_entropy(model(x), y)
'''
_SCALED = _HEAD + '''    scaler.scale(loss).backward()
'''

# name -> (source, a fragment the failure message must contain)
WRONG_STEPS = {
    # clips the scaled gradients, then unscales: the threshold is applied to grad * scale
    "clip before unscale_": (_SCALED + '''
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "unscale_ 之前"),
    # never calls unscale_ (scaler.step unscales later, after the clipping)
    "no unscale_": (_SCALED + '''
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "unscale_ 之前"),
    # plain loss.backward(): the gradients are not scaled, but unscale_ still divides by the scale
    "backward without scaler.scale": (_HEAD + '''
    loss.backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "scaler.scale(loss)"),
    # forgets scaler.update(): the scale never grows or backs off
    "forgot update": (_SCALED + '''
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    return norm
''', "scaler.update()"),
    # update before step: step then unscales a second time
    "update before step": (_SCALED + '''
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.update()
    scaler.step(optimizer)
    return norm
''', "期望"),
    # optimizer.step() directly: the inf step is not skipped and NaN reaches the weights
    "optimizer.step bypasses the scaler": (_SCALED + '''
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scaler.update()
    return norm
''', "scaler.step(optimizer)"),
    # returns the norm after clipping (which equals max_norm) instead of the pre-clip norm
    "returns the post-clip norm": (_SCALED + '''
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "裁剪后的范数"),
    # measures the norm but never clips (max_norm=inf)
    "no clipping": (_SCALED + '''
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "忘了裁剪"),
    # clips after the step: the update already used the unclipped gradients
    "clip after step": (_SCALED + '''
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.update()
    return norm
''', "step 之后"),
    # no autocast: the forward runs in fp32
    "no autocast": ('''
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
''', "autocast"),
    # hard-codes bf16 instead of the amp_dtype argument
    "bf16 hard-coded": ('''
import torch
import torch.nn.functional as F

def amp_train_step(model, optimizer, scaler, x, y, max_norm, amp_dtype=torch.float16):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=True):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "amp_dtype"),
    # forgets zero_grad: gradients accumulate across steps
    "no zero_grad": ('''
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
''', "zero_grad"),
    # model.half() "to save memory": fp16 master weights (unscale_ refuses fp16 gradients)
    "half model": ('''
import torch
import torch.nn.functional as F

def amp_train_step(model, optimizer, scaler, x, y, max_norm, amp_dtype=torch.float16):
    model.half()
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x.half()).float(), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "FP16"),
    # returns the loss instead of the gradient norm
    "returns the loss": (_SCALED + '''
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss
''', "期望"),
    # forgets the return statement
    "returns None": (_SCALED + '''
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
''', "None"),
}

# name -> (source, fragment)
WRONG_NEEDS_SCALER = {
    # thinks bf16 needs a scaler too ("every 16-bit format does")
    "bf16 too": ("import torch\ndef needs_scaler(dtype):\n    return dtype in (torch.float16, torch.bfloat16)\n",
                 "8 位指数"),
    # decides by the number of bits
    "any 16-bit format": ("import torch\ndef needs_scaler(dtype):\n    return torch.finfo(dtype).bits <= 16\n",
                          "8 位指数"),
    # decides by precision (eps) instead of range: bf16's eps is the largest
    "looks at eps (precision)": ("import torch\ndef needs_scaler(dtype):\n"
                                 "    return torch.finfo(dtype).eps > torch.finfo(torch.float32).eps\n", "尾数"),
    # the comparison the wrong way round: fp64 "needs" it, fp16 does not
    "comparison reversed": ("import torch\ndef needs_scaler(dtype):\n"
                            "    return torch.finfo(dtype).smallest_normal < torch.finfo(torch.float32).smallest_normal\n",
                            "反了"),
    "always": ("def needs_scaler(dtype):\n    return True\n", "期望"),
    "never": ("def needs_scaler(dtype):\n    return False\n", "5 位指数"),
    # returns a string
    "returns a string": ("import torch\ndef needs_scaler(dtype):\n"
                         "    return 'yes' if dtype == torch.float16 else 'no'\n", "True/False"),
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
    with pytest.raises(CheckFailed, match="练习尚未完成"):
        check_amp_train_step(run_source(stub)["amp_train_step"])


@pytest.mark.parametrize("name", sorted(WRONG_STEPS))
def test_amp_step_wrong_answers_fail_with_their_hint(name):
    source, fragment = WRONG_STEPS[name]
    with pytest.raises(CheckFailed) as info:
        check_amp_train_step(run_source(source)["amp_train_step"])
    assert fragment in str(info.value), str(info.value)


def test_amp_step_constant_return_fails():
    with pytest.raises(CheckFailed):
        check_amp_train_step(lambda *args, **kwargs: 1.0)


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
    with pytest.raises(CheckFailed, match="练习尚未完成"):
        check_needs_scaler(run_source(stub)["needs_scaler"])


@pytest.mark.parametrize("name", sorted(WRONG_NEEDS_SCALER))
def test_needs_scaler_wrong_answers_fail_with_their_hint(name):
    source, fragment = WRONG_NEEDS_SCALER[name]
    with pytest.raises(CheckFailed) as info:
        check_needs_scaler(run_source(source)["needs_scaler"])
    assert fragment in str(info.value), str(info.value)


def test_stub_hints_contain_no_graded_answer(pairs):
    # needs_scaler's graded answer is "fp16 only", reached through finfo's smallest_normal: the hint names neither
    (hint,) = stub_hints(pairs[1][1])
    assert hint
    for answer in ("float16", "fp16", "bfloat16", "bf16", "smallest_normal", "tiny", "True", "False"):
        assert answer not in hint, answer


def test_helper_agrees_with_the_solution(pairs):
    from course_utils.amp import needs_grad_scaler

    fn = run_source(pairs[1][0])["needs_scaler"]
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        assert bool(fn(dtype)) == needs_grad_scaler(dtype)


def test_demo_cells_never_call_an_exercise():
    assert demo_cells_using_exercises(NAME) == []


@pytest.mark.slow
def test_amp_step_verdicts_do_not_depend_on_the_seed(pairs, workbook_threads):
    # check_needs_scaler takes no random input, so only the AMP step is swept
    solution = run_source(pairs[0][0])["amp_train_step"]
    wrong = {name: run_source(source)["amp_train_step"] for name, (source, _) in WRONG_STEPS.items()}
    for seed in SWEEP_SEEDS:
        check_amp_train_step(solution, seed=seed)
        for name, fn in wrong.items():
            with pytest.raises(CheckFailed):
                check_amp_train_step(fn, seed=seed)
