"""Gradient accumulation in the professional script (issue 35): ``--accum-steps K`` takes the step of the
whole batch, across kills, ranks and AMP.

Units (in this process): K = 1 is the step the script took before accumulation existed, bit for bit; K micro-
batches of uneven size equal one batch in float64; fp16 with GradScaler unscales, steps and updates once per
window. Runs: K = 4 against the same run with one batch (within float tolerance), a SIGKILL inside a window
then --resume (exact), K changed on --resume (allowed), K larger than a process's share (refused); two ranks
with K = 2 under torchrun: one gradient all-reduce per optimizer step, exact across a kill of the whole job.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_utils.amp import make_grad_scaler
from course_utils.clipping import clip_gradients
from course_utils.monitor import read_metrics
from tests.support.pro_runs import REFERENCE, finish, load_script, run_all, start, status, train_losses
from tests.support.torchrun_jobs import job_processes, kill_job, launch

SCRIPT = load_script()


def tiny(dtype=torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5)).to(dtype)


def batch(n: int, dtype=torch.float32, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 2, 2, generator=g, dtype=dtype), torch.randint(0, 5, (n,), generator=g)


def steps(model: nn.Module, k: int, n_steps: int = 3, dtype=torch.float32, clip: float = 0.5,
          loss_weight: float = 1.0) -> list[torch.Tensor]:
    """The script's train_step, ``n_steps`` times with K = ``k``: the parameters after each step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    scaler, after = make_grad_scaler(torch.device("cpu"), None), []
    for s in range(n_steps):
        x, y = batch(16, dtype, seed=s)
        SCRIPT.train_step(model, x, y, optimizer=optimizer, scheduler=scheduler, scaler=scaler, ema=None,
                          device=torch.device("cpu"), amp_dtype=None, clip=clip, loss_weight=loss_weight,
                          accum_steps=k)
        after.append(torch.cat([p.detach().flatten() for p in model.parameters()]).clone())
    return after


@pytest.mark.parametrize("loss_weight", [1.0, 15 * 2 / 32])  # DDP: an uneven share of 15 samples of 32
def test_one_micro_batch_is_the_plain_step_bit_for_bit(loss_weight):
    """K = 1 is today's step: forward, fp32 loss times the rank's weight, backward, clip, AdamW step."""
    got = steps(tiny(), 1, loss_weight=loss_weight)
    model = tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for s, expected in enumerate(got):
        x, y = batch(16, seed=s)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).float(), y)
        (loss * loss_weight if loss_weight != 1.0 else loss).backward()
        clip_gradients(model.parameters(), 0.5)
        optimizer.step()
        assert torch.equal(torch.cat([p.detach().flatten() for p in model.parameters()]), expected), s


@pytest.mark.parametrize("k", [2, 3, 16])  # 3: 6 + 5 + 5 samples (uneven); 16: one sample each
def test_k_uneven_micro_batches_equal_one_batch_in_float64(k):
    one, accumulated = steps(tiny(torch.float64), 1, dtype=torch.float64), steps(tiny(torch.float64), k,
                                                                                  dtype=torch.float64)
    for a, b in zip(one, accumulated):
        assert ((a - b).abs().max() / a.abs().max()).item() <= 1e-12


def test_fp16_unscales_steps_and_updates_once_per_window():
    model = tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    calls = {"scale": 0, "unscale_": 0, "step": 0, "update": 0}
    for name in calls:
        real = getattr(scaler, name)
        setattr(scaler, name, lambda *a, _real=real, _name=name, **kw: calls.__setitem__(_name, calls[_name] + 1)
                or _real(*a, **kw))
    x, y = batch(16)
    result = SCRIPT.train_step(model, x, y, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 1.0), scaler=scaler, ema=None, device=torch.device("cpu"), amp_dtype=torch.float16,
        clip=1.0, accum_steps=4)
    assert calls == {"scale": 4, "unscale_": 1, "step": 1, "update": 1}, calls
    assert not result.skipped and torch.isfinite(result.loss)


def test_a_window_with_one_non_finite_micro_batch_is_skipped_whole():
    model = tiny()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    x, y = batch(16)
    x[12] = float("nan")  # in the last of 4 micro-batches: the first three were fine
    result = SCRIPT.train_step(model, x, y, optimizer=optimizer, scheduler=scheduler,
                               scaler=make_grad_scaler(torch.device("cpu"), None), ema=None,
                               device=torch.device("cpu"), amp_dtype=None, clip=1.0, accum_steps=4)
    assert result.skipped and scheduler.last_epoch == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "no part of the window was applied"


# ------------------------------------------------------------------ runs of the script
K4 = [*REFERENCE, "--accum-steps", "4"]


def stopped(proc) -> bool:
    try:
        return Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The uninterrupted K = 4 run, and a K = 4 run that froze itself inside a window (SIGSTOP as micro-batch
    ``nth`` starts its backward at a random step), then was SIGKILLed: name -> (folder, step, nth)."""
    root, rng = tmp_path_factory.mktemp("accum"), random.Random(35)
    step, nth = rng.randint(2, 28), rng.randint(1, 4)
    killed = start(root / "killed", *K4, "--inject-stall", f"0:{step}:backward:{nth}", interpreter="forked")
    reference = start(root / "k4", *K4, interpreter="forked")
    deadline = time.monotonic() + 120
    while not stopped(killed):
        assert killed.poll() is None and time.monotonic() < deadline, killed.stdout.read()[-2000:]
        time.sleep(0.02)
    os.kill(killed.pid, signal.SIGKILL)
    finish(killed)
    code, output = finish(reference)
    assert code == 0, output[-2000:]
    return {"k4": root / "k4", "killed": (root / "killed", step, nth)}


@pytest.mark.slow
def test_four_micro_batches_take_the_one_batch_step_within_float_tolerance(runs, reference):
    one, four = dict(train_losses(reference)), dict(train_losses(runs["k4"]))
    assert sorted(four) == list(range(1, 31))
    worst = max(abs(one[s] - four[s]) / abs(one[s]) for s in one)
    assert worst <= 1e-5, worst
    assert any(one[s] != four[s] for s in one), "the losses were summed in another order: K = 4 was applied"
    exchanges = [r["exchanges"] for r in read_metrics(runs["k4"] / "metrics.jsonl") if r.get("split") == "ranks"]
    assert exchanges and all(e == [0.0] for e in exchanges), "a plain run all-reduces nothing"


@pytest.mark.slow
def test_a_kill_inside_a_window_resumes_exactly_and_k_may_change_on_resume(runs, tmp_path):
    """The window in progress is replayed from the last checkpoint (they fall between windows only). A copy of the
    killed run resumed with K = 2 is accepted (the global batch is unchanged) but is not bitwise the K = 4 run."""
    out, step, nth = runs["killed"]
    assert status(out)["state"] == "running", "killed: it could not say how it ended"
    changed = tmp_path / "k2"
    shutil.copytree(out, changed)
    (code, output), (code2, output2) = run_all([(out, [*K4, "--resume"]), (changed, [*K4[:-1], "2", "--resume"])],
                                               interpreter="forked")
    assert code == 0 and code2 == 0, (output[-2000:], output2[-2000:])
    assert train_losses(out) == train_losses(runs["k4"]), (step, nth)
    k2, k4 = dict(train_losses(changed)), dict(train_losses(runs["k4"]))
    assert sorted(k2) == sorted(k4) and max(abs(k2[s] - k4[s]) / abs(k4[s]) for s in k4) <= 1e-5


@pytest.mark.slow
def test_more_micro_batches_than_samples_per_process_is_refused(tmp_path):
    code, output = finish(start(tmp_path / "refused", *REFERENCE, "--accum-steps", "33", interpreter="forked"))
    assert code == 2 and "--accum-steps 33 大于每个进程每步的样本数 32" in output, output
    assert not (tmp_path / "refused" / "checkpoints").exists()


@pytest.mark.slow
def test_two_ranks_accumulating_all_reduce_once_per_step_and_resume_exactly_after_a_kill(tmp_path):
    """2 gloo ranks, K = 2: ``no_sync`` on the first micro-batch, so DDP's comm hook (the heartbeat's) runs once
    per optimizer step; the whole job SIGKILLed at a random step, then --resume: the reference's losses."""
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    ref_proc, _ = launch(reference, "--accum-steps", "2")
    proc, job = launch(killed, "--accum-steps", "2")
    target = random.Random(352).randint(4, 20)
    deadline = time.monotonic() + 120
    while not (train_losses(killed) and train_losses(killed)[-1][0] >= target):
        assert proc.poll() is None and time.monotonic() < deadline, "the job ended before the kill"
        time.sleep(0.01)
    kill_job(proc, job)
    code, output = finish(ref_proc)
    assert code == 0, output[-2000:]
    code, output = finish(launch(killed, "--accum-steps", "2", "--resume")[0])
    assert code == 0 and "续训" in output, output[-2000:]
    assert train_losses(killed) == train_losses(reference), target
    exchanges = [r["exchanges"] for r in read_metrics(reference / "metrics.jsonl") if r.get("split") == "ranks"]
    assert len(exchanges) == 30 and all(e == [1.0, 1.0] for e in exchanges), exchanges[:3]
    assert not job_processes(job)
