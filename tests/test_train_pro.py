"""End-to-end tests of solutions/homework/train_cifar_pro.py: exact resume after SIGKILL, SIGTERM, NaN."""
import json
import shutil
import signal

import pytest

from course_utils.checkpoint import CheckpointManager, load_verified
from course_utils.monitor import read_metrics
from course_utils.schedule import lr_at
from tests.support.pro_runs import REFERENCE_3_EPOCHS as ARGS
from tests.support.pro_runs import finish, newest_checkpoint, run, start, status, train_losses, train_records, wait_for_step

pytestmark = pytest.mark.slow
# ARGS: 15 steps per epoch, 45 steps in all, a checkpoint every 4 steps, 2 DataLoader workers
TOTAL = 45


def test_reference_run_outputs(reference_3_epochs):
    config = json.loads((reference_3_epochs / "config.json").read_text())
    assert config["hparams"]["seed"] == 0 and len(config["git_commit"]) == 40
    recs = read_metrics(reference_3_epochs / "metrics.jsonl")
    train = [r for r in recs if r["split"] == "train"]
    assert [r["step"] for r in train] == list(range(1, TOTAL + 1))
    for key in ("step", "epoch", "loss", "loss_smooth", "grad_norm", "clipped", "lr", "samples_per_sec", "mem_peak_mb"):
        assert key in train[0]
    assert [r["lr"] for r in train] == pytest.approx([lr_at(s, 3e-3, 5, TOTAL) for s in range(TOTAL)])
    val = [r for r in recs if r["split"] == "val"]
    assert [r["epoch"] for r in val] == [0, 1, 2] and {"acc", "acc_ema"} <= set(val[0])
    assert val[-1]["acc"] > 0.15  # learns something in 45 tiny steps
    names = sorted(p.name for p in (reference_3_epochs / "checkpoints").glob("*.pt"))
    assert names == ["best.pt", "last_good.pt", "step_00000044.pt", "step_00000045.pt"]  # last 2 + best + last good
    assert status(reference_3_epochs)["state"] == "finished" and status(reference_3_epochs)["exit_code"] == 0


def test_sigkill_anywhere_then_resume_is_bit_identical(reference_3_epochs, tmp_path):
    out = tmp_path / "killed"
    # SIGKILL right after step 7 (mid-epoch 0; the checkpoint of step 4 is the newest), then after 18 more steps of
    # the resumed process: step 22, mid-epoch 1; with 2 DataLoader workers
    for kill_after, resume in ((7, []), (18, ["--resume"])):
        proc = start(out, *ARGS, *resume, kill_after=kill_after, interpreter="forked")
        _, output = finish(proc)
        assert proc.returncode == -signal.SIGKILL, output[-3000:]
    assert train_losses(out)[-1][0] < 22 and newest_checkpoint(out) == 20  # killed inside step 22, before its log
    code, output = run(out, *ARGS, "--resume", interpreter="forked")
    assert code == 0 and "续训" in output, output
    assert train_losses(out) == train_losses(reference_3_epochs)  # exact float equality, every step exactly once


def test_sigterm_saves_and_exits_as_preempted(tmp_path):
    proc = start(tmp_path, *ARGS, interpreter="forked")
    wait_for_step(proc, tmp_path, 9)
    proc.send_signal(signal.SIGTERM)
    code, output = finish(proc, 60)
    assert code == 75 and "SIGTERM" in output, output
    last = train_losses(tmp_path)[-1][0]
    state = CheckpointManager(tmp_path / "checkpoints").load_latest().state
    assert state["step"] == last, "the final checkpoint covers the last logged step"
    assert status(tmp_path)["state"] == "preempted" and status(tmp_path)["step"] == last


def test_nan_step_is_skipped_and_checkpoints_stay_valid(tmp_path):
    code, output = run(tmp_path, *ARGS, "--inject-nan-at-step", "6", "--max-steps", "12", interpreter="forked")
    assert code == 0 and "non-finite step" in output, output
    recs = train_records(tmp_path)
    assert recs[5]["step"] == 6 and recs[5]["skipped"] and not any(r["skipped"] for r in recs if r["step"] != 6)
    assert all(r["loss"] == r["loss"] for r in recs[6:]), "no NaN after the skipped step"
    paths = sorted((tmp_path / "checkpoints").glob("*.pt"))
    assert len(paths) >= 2
    for path in paths:  # every retained file verifies and holds finite weights
        state = load_verified(path)
        assert all(v.isfinite().all() for v in state["model"].values() if v.is_floating_point()), path.name
    assert load_verified(tmp_path / "checkpoints" / "last_good.pt")["step"] == 4, "the newest save before the NaN"


def test_repeated_nan_stops_with_clear_message(tmp_path):
    code, output = run(tmp_path, *ARGS, "--inject-nan-at-step", "3", "--max-bad-steps", "1", "--max-steps", "12",
                       interpreter="forked")
    assert code == 3 and "停止训练" in output and "还没有健康的检查点" in output, output
    assert status(tmp_path)["state"] == "stopped_bad_steps"


def test_resume_with_changed_model_is_refused(reference_3_epochs, tmp_path):
    shutil.copytree(reference_3_epochs, tmp_path / "run")
    code, output = run(tmp_path / "run", *ARGS, "--resume", "--width", "16", interpreter="forked")
    assert code == 2 and "width 8 → 16" in output, output
