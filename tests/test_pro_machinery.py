"""The machinery the professional script calls instead of holding it (issue 49): ``cli.guarded`` and ``cli.failed``
(every way out of a training, one line and its exit code), ``cli.resume_notes``, ``cli.add_probe_flags`` and
``RunBatches.check``. Fast: no training."""
from __future__ import annotations

import errno
import json

import pytest
import torch
from torch.utils.data import TensorDataset

from course_utils.cli import PROBE_FLAGS, Parser, add_probe_flags, guarded, resume_notes
from course_utils.distributed import RanksDisagree, World
from course_utils.run_batches import RunBatches
from course_utils.runfolder import ExitCode, Refused, RunFolder


def _raise(exc: BaseException):
    def train():
        raise exc
    return train


@pytest.mark.parametrize("exc, code, line", [
    (Refused("--batch-size 9 太大"), ExitCode.REFUSED, "拒绝运行: --batch-size 9 太大"),
    (RanksDisagree("rank 1 在 step 3"), ExitCode.FAILED, "失败: rank 1 在 step 3"),
    (OSError(errno.ENOSPC, "No space left on device", "/x/metrics.jsonl"), ExitCode.FAILED,
     "读写 /x/metrics.jsonl 失败(No space left on device)"),
    (KeyboardInterrupt(), ExitCode.FAILED, "第二次 Ctrl-C: 立即停止,本次没有保存"),
    (ZeroDivisionError("boom"), ExitCode.FAILED, "ZeroDivisionError: boom"),
])
def test_guarded_gives_each_way_out_its_exit_code_and_one_line(tmp_path, capsys, exc, code, line):
    with RunFolder.claim(tmp_path / "run", resume=False) as run:
        got = guarded(_raise(exc), run, World(), tmp_path / "run", expected=(RanksDisagree,))
    err = capsys.readouterr().err
    assert got == code and line in err, err
    status = json.loads((tmp_path / "run" / "status.json").read_text()) if code == ExitCode.FAILED else None
    assert status is None or (status["state"] == "failed" and line.removeprefix("失败: ") in status["message"]), status


def test_guarded_passes_the_trainings_own_exit_code_and_other_ranks_write_nothing(tmp_path, capsys):
    assert guarded(lambda: ExitCode.PREEMPTED, None, World(rank=1, size=2, launched=True), tmp_path) == 75
    assert guarded(_raise(ValueError("x")), None, World(rank=1, size=2, launched=True), tmp_path) == ExitCode.FAILED
    assert "rank 1 失败: ValueError: x" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_resume_notes_say_what_differs_and_nothing_else():
    assert resume_notes({}, "cpu", "cpu", 2, 2, 128) == []
    assert resume_notes({}, None, "cpu", 1, 1, 128) == []  # an old checkpoint without a device: nothing to say
    notes = resume_notes({"lr": (2e-3, 1e-3)}, "cuda:0", "cpu", 1, 2, 128)
    assert len(notes) == 3 and "lr 0.002 → 0.001" in notes[0] and "cuda:0" in notes[1]
    assert "由 1 个进程保存,现在是 2 个" in notes[2] and "全局 batch 仍是 128" in notes[2]


def test_probe_flags_are_hidden_and_validated(capsys):
    p = Parser(prog="t.py")
    add_probe_flags(p)
    assert all(f"--{name.replace('_', '-')}" not in p.format_help() for name in PROBE_FLAGS)
    args = p.parse_args(["--inject-nan-at-step", "3,5", "--inject-stall", "1:4:forward:1"])
    assert args.inject_nan_at_step == (3, 5) and args.inject_stall == ((1, 4, 2, 1),)
    assert sorted(vars(p.parse_args([]))) == sorted(PROBE_FLAGS)
    with pytest.raises(SystemExit) as exc:
        p.parse_args(["--inject-stall", "1:4:lunch:1"])
    assert exc.value.code == 2 and "RANK:STEP:PHASE:NTH" in capsys.readouterr().err


@pytest.mark.parametrize("samples, batch, ranks, accum, refused", [
    (10, 8, 1, 1, None), (10, 8, 2, 4, None),
    (10, 16, 1, 1, "大于训练集(10 张)"), (10, 1, 2, 1, "小于进程数 2"), (10, 8, 2, 5, "--accum-steps 5 大于每个进程每步的样本数 4"),
])
def test_run_batches_check_refuses_a_batch_the_run_cannot_train(samples, batch, ranks, accum, refused):
    data = RunBatches(TensorDataset(torch.zeros(samples, 1)), batch, seed=0, world=World(size=ranks))
    if refused is None:
        data.check(accum)
        return
    with pytest.raises(Refused, match=refused.replace("(", r"\(").replace(")", r"\)")):
        data.check(accum)
