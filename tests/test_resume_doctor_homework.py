"""The homework checks speak the resume doctor's language (issue 51): real learner mistakes in the reference answer.

Two mistakes a new learner made in an own homework, which the loss-based hints misnamed: the weights saved as
fp16 (``check_resume`` said "权重对了" and blamed the optimizer or the RNG; ``check_ema`` blamed the EMA) and the
resume one step early (the checkpoint's own step trained again: the hint pointed at data order and RNG). Each
is the reference answer ``solutions/homework/train_cifar.py`` with one line changed, run as real training (forked
from a server that imported torch: ``FORKED_TORCH``). That the reference itself passes both checks, compared
exactly, is ``solutions/10_homework.ipynb``'s run of every check (nbval).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from course_tools.checks import CheckFailed
from course_tools.checks import nb10_homework as homework
from tests.support.homework_scripts import FORKED_TORCH
from tests.support.notebook_cells import ROOT

REFERENCE = ROOT / "solutions" / "homework" / "train_cifar.py"
SAVE = "manager.save(training_state(model=model, optimizer=optimizer, ema=ema, epoch=epoch, step=step,"
LOAD = 'step = restore_training_state(found.state, model=model, optimizer=optimizer, ema=ema)["step"]'
# mistake: (the line of the reference, what the learner wrote instead, the fragments each check's failure names)
MISTAKES = {
    "fp16 weights": (SAVE, "manager.save(half_weights(model=model, optimizer=optimizer, ema=ema, epoch=epoch, step=step,",
                     ("fp16", "权重")),
    "one step early": (LOAD, LOAD + " - 1", ("步数计数", "检查点那一步")),
}
HALF = ("\n\ndef half_weights(**kw):  # the mistake: the weights stored as fp16 to save space\n"
        "    state = training_state(**kw)\n"
        "    state['model'] = {k: v.half() for k, v in state['model'].items()}\n"
        "    return state\n")


def _learner_copy(folder: Path, mistake: str) -> Path:
    line, wrong, _ = MISTAKES[mistake]
    text = REFERENCE.read_text(encoding="utf-8")
    assert text.count(line) == 1, line
    text = text.replace(line, wrong)
    if mistake == "fp16 weights":
        text = text.replace('\n\nif __name__ == "__main__":', HALF + '\n\nif __name__ == "__main__":')
    folder.mkdir(parents=True)
    (folder / "train_cifar.py").write_text(text, encoding="utf-8")
    return folder / "train_cifar.py"


@pytest.mark.slow
@pytest.mark.parametrize("check, mistake", [("check_resume", "fp16 weights"), ("check_ema", "fp16 weights"),
                                            ("check_resume", "one step early")])
def test_the_check_names_the_doctors_cause(check, mistake, tmp_path):
    script = _learner_copy(tmp_path / "hw", mistake)
    with pytest.raises(CheckFailed) as failed:
        getattr(homework, check)(script, launcher=FORKED_TORCH)
    hint = failed.value.hint
    assert "续训医生" in hint and all(f in hint for f in MISTAKES[mistake][2]), hint
    assert "EMA" not in hint and "优化器状态" not in hint, hint  # not the wrong suspects of the loss-based hints
