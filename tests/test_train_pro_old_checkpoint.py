"""A run folder written by the professional script before its checkpoint held a registry of stateful parts.

``tests/fixtures/pro_run_before_registry`` is what commit 34f9781 of ``train_cifar_pro.py`` left after a SIGKILL
in step 18 of the rollback run of ``test_train_pro_rollback`` (``ROLLBACK`` below: one rollback done, at step
12 back to step 8; the second one, at step 21, still ahead). Its checkpoints keep the run's monitor and
rollback state under string keys of ``extra`` (``extra["monitor"]``, ``extra["rollback"]["skips"]`` and
``["position"]``). Made with::

    COURSE_FAST=1 OMP_NUM_THREADS=1 python course_utils/interrupt.py 19 solutions/homework/train_cifar_pro.py \\
        --out RUN <ROLLBACK>
    # kept: config.json, metrics.jsonl, status.json, skipped_batches.json, checkpoints/step_00000016.pt
    # and checkpoints/last_good.pt (the same bytes), with their .sha256

``--resume`` from it must go on exactly as that commit's script did: the numbers below are that script's.
"""
from __future__ import annotations

import shutil

import pytest

from course_utils.monitor import read_metrics
from tests.support.notebook_cells import ROOT
from tests.support.pro_runs import TINY, run, status, train_losses

pytestmark = pytest.mark.slow  # starts the script

FIXTURE = ROOT / "tests" / "fixtures" / "pro_run_before_registry"
ROLLBACK = [*TINY, "--epochs", "2", "--ckpt-every-steps", "4", "--log-every", "3",
            "--inject-bad-batch", "9,10,11,24,25,26", "--max-bad-steps", "3", "--bad-step-window", "10",
            "--on-spike", "rollback", "--skip-batches", "2", "--rollback-lr-factor", "0.5"]
# what commit 34f9781's script wrote after resuming from the fixture (steps 17-30, the second rollback at 21)
LOSSES_AFTER_RESUME = [
    (17, 2.325312614440918), (18, 2.2949304580688477), (19, 2.2751624584198), (20, 2.302586317062378),
    (21, 2.3025617599487305), (22, 2.2965879440307617), (23, 2.291714906692505), (24, 2.2783894538879395),
    (25, 2.290245532989502), (26, 2.306032419204712), (27, 2.274923801422119), (28, 2.2814137935638428),
    (29, 2.293931722640991), (30, 2.302941083908081)]
ROLLBACKS = [
    {"number": 1, "bad_step": 12, "restored_step": 8, "first_position": 8, "last_position": 13, "skipped": 6},
    {"number": 2, "bad_step": 21, "restored_step": 16, "first_position": 22, "last_position": 28, "skipped": 7}]
EVALS = [(15, 0.13, 2.3235545349121094, 2.3268975830078125), (30, 0.14, 2.3157998657226564, 2.3163130187988283)]


def test_a_checkpoint_of_the_old_layout_resumes_exactly(tmp_path):
    out = tmp_path / "run"
    shutil.copytree(FIXTURE, out)
    kept = [r for r in train_losses(out) if r[0] <= 16]
    code, output = run(out, *ROLLBACK, "--resume", interpreter="forked")
    assert code == 0, output[-3000:]
    assert "从 step_00000016.pt 续训: step 16" in output, output[-3000:]
    losses = train_losses(out)
    assert [s for s, _ in losses] == list(range(1, 31))
    assert losses[:16] == kept, "the records the checkpoint covers are kept as they were"
    assert losses[16:] == [(s, pytest.approx(v, rel=1e-4)) for s, v in LOSSES_AFTER_RESUME]
    records = read_metrics(out / "metrics.jsonl")
    events = [{k: r[k] for k in ROLLBACKS[0]} for r in records if r.get("event") == "rollback"]
    assert events == ROLLBACKS, "the old checkpoint's rollback is still known: the second one is number 2"
    evals = [(r["step"], r["acc"], r["loss"], r["loss_ema"]) for r in records if r.get("split") == "val"]
    assert evals == [(s, a, pytest.approx(lo, rel=1e-4), pytest.approx(le, rel=1e-4)) for s, a, lo, le in EVALS]
    final = status(out)
    assert final["state"] == "finished" and final["step"] == 30
    assert [(h["step"], h["to_step"], h["lr_factor"]) for h in final["history"]] == [(12, 8, 0.5), (21, 16, 0.5)]
