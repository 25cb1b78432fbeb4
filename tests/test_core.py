"""Unit tests of the training-engineering helpers (repro, amp, clipping, ema, checkpoint, monitor, ...)."""
import copy
import json
import math
import os
import random

import numpy as np
import pytest
import torch
import xxhash
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from course_utils import alerts, amp, checkpoint, clipping, debug, estimate, monitor, repro, schedule, sinks
from course_utils.ema import EMA
from course_utils.models import build_model


def draws():
    return (random.random(), float(np.random.rand()), torch.rand(3).tolist())


# ---------------------------------------------------------------- repro
def test_set_seed_and_rng_state_roundtrip():
    repro.set_seed(123)
    first = draws()
    repro.set_seed(123)
    assert draws() == first
    state = repro.rng_state()
    after = draws()
    draws()
    repro.set_rng_state(state)
    assert draws() == after


def test_rng_state_survives_weights_only_load(tmp_path):
    repro.set_seed(5)
    np.random.randn()  # leave numpy's cached gaussian in a non-default state
    path = tmp_path / "rng.pt"
    torch.save(repro.rng_state(), path)
    expected = draws()
    repro.set_seed(99)
    repro.set_rng_state(torch.load(path, weights_only=True))
    assert draws() == expected


def test_dump_run_config(tmp_path):
    cfg = repro.dump_run_config(tmp_path, {"lr": 0.1, "out": tmp_path}, "cpu", repo=tmp_path)
    torch.save({"config": cfg}, tmp_path / "c.pt")
    assert torch.load(tmp_path / "c.pt", weights_only=True)["config"] == cfg  # storable in a checkpoint
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved == cfg and saved["hparams"]["lr"] == 0.1 and saved["hparams"]["out"] == str(tmp_path)
    assert saved["git_commit"] == "unknown" and saved["git_dirty"] == "unknown"  # not a git repo
    for key in ("torch", "device", "command", "started_at", "python"):
        assert saved[key] is not None
    from tests.support.notebook_cells import ROOT
    commit, dirty = repro.git_commit(ROOT)
    assert len(commit) == 40 and isinstance(dirty, bool)


def test_determinism_switch_roundtrip():
    repro.set_deterministic(True)
    try:
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.benchmark
    finally:
        repro.set_deterministic(False)
    assert not torch.are_deterministic_algorithms_enabled()


# ---------------------------------------------------------------- amp
def test_amp_choices():
    cpu = torch.device("cpu")
    assert amp.autocast_dtype(cpu, "bf16") is torch.bfloat16 and amp.autocast_dtype(cpu, "off") is None
    assert amp.needs_grad_scaler(torch.float16) and not amp.needs_grad_scaler(torch.bfloat16)
    assert not amp.make_grad_scaler(cpu, torch.bfloat16).is_enabled()
    assert amp.make_grad_scaler(cpu, torch.float16).is_enabled()
    with pytest.raises(ValueError, match="amp"):
        amp.autocast_dtype(cpu, "fp8")
    with amp.autocast(cpu, torch.bfloat16):
        assert (torch.randn(4, 4) @ torch.randn(4, 4)).dtype is torch.bfloat16


def test_dtype_table_values():
    rows = {r["dtype"]: r for r in amp.dtype_table()}
    assert rows["fp16"]["max"] == 65504.0 and rows["fp16"]["min_subnormal"] == 2.0 ** -24
    assert rows["bf16"]["exponent"] == rows["fp32"]["exponent"] == 8
    assert rows["bf16"]["eps"] == 2.0 ** -7 and rows["fp32"]["min_normal"] == torch.finfo(torch.float32).tiny
    assert "fp16" in amp.format_dtype_table()


# ---------------------------------------------------------------- clipping
def _model_with_grads(scale=10.0, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    (model(torch.randn(32, 8)).pow(2).sum() * scale).backward()
    return model


@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_equals_torch_and_returns_preclip_norm(max_norm):
    a, b = _model_with_grads(), _model_with_grads()
    expected = torch.nn.utils.clip_grad_norm_(b.parameters(), max_norm)
    result = clipping.clip_gradients(a.parameters(), max_norm)
    assert torch.equal(result.norm, expected)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters()))
    assert bool(result.clipped) == (expected.item() > max_norm) and result.is_finite()
    if max_norm < expected:
        assert math.isclose(clipping.global_grad_norm(a.parameters()).item(), max_norm, rel_tol=1e-4)


def test_clip_detects_non_finite_and_measure_only():
    model = _model_with_grads()
    before = [p.grad.clone() for p in model.parameters()]
    result = clipping.clip_gradients(model.parameters(), None)
    assert not bool(result.clipped) and all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), before))
    next(model.parameters()).grad[0, 0] = float("inf")
    assert not clipping.clip_gradients(model.parameters(), 1.0).is_finite()


def test_clip_unscales_first_with_scaler():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    reference = copy.deepcopy(model)
    x = torch.randn(32, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, enabled=True)
    scaler.scale(model(x).pow(2).sum()).backward()
    reference(x).pow(2).sum().backward()
    result = clipping.clip_gradients(model.parameters(), 1.0, scaler=scaler, optimizer=opt)
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    assert torch.allclose(result.norm, expected)
    assert all(torch.allclose(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))
    with pytest.raises(ValueError, match="optimizer"):
        clipping.clip_gradients(model.parameters(), 1.0, scaler=scaler)


# ---------------------------------------------------------------- ema
def _train_steps(model, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        x = torch.randn(4, 3, 32, 32, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        yield


def test_ema_equals_averaged_model():
    torch.manual_seed(0)
    model = build_model("small", width=4)
    ours = EMA(model, decay=0.9)
    theirs = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    for _ in _train_steps(model, 30):
        ours.update(model)
        theirs.update_parameters(model)
    for p, q in zip(ours.module.parameters(), theirs.module.parameters()):
        assert torch.equal(p, q)
    # BN buffers are copied from the live model (as AveragedModel does with use_buffers=False);
    # averaging them (use_buffers=True) truncates the integer num_batches_tracked
    bn, ours_bn = model.features[0][1], ours.module.features[0][1]
    assert torch.equal(ours_bn.running_mean, bn.running_mean) and ours_bn.num_batches_tracked.item() == 30


def test_ema_warmup_swap_and_state_dict():
    torch.manual_seed(0)
    model = build_model("tiny", width=4)
    ema = EMA(model, decay=0.999, warmup=True)
    assert ema.current_decay() == 0.0  # the first update copies the weights
    ema.update(model)
    assert ema.current_decay() == pytest.approx(2 / 11)
    for _ in _train_steps(model, 5):
        ema.update(model)
    assert ema.current_decay() < 0.999
    live = copy.deepcopy(model.state_dict())
    with ema.swapped_into(model):
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ema.module.parameters()))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in live.items())
    restored = EMA(build_model("tiny", width=4))
    restored.load_state_dict(ema.state_dict())
    assert restored.num_updates == 6 and all(
        torch.equal(a, b) for a, b in zip(restored.module.parameters(), ema.module.parameters()))
    with pytest.raises(ValueError):
        EMA(model, decay=1.0)


# ---------------------------------------------------------------- checkpoint
def _state(step):
    torch.manual_seed(step)
    model = build_model("tiny", width=4)
    opt = torch.optim.AdamW(model.parameters())
    sched = schedule.make_scheduler(opt, 2, 10)
    return checkpoint.training_state(model=model, optimizer=opt, scheduler=sched, ema=EMA(model), epoch=0,
                                     step=step, batch_in_epoch=step, config={"lr": 1.0})


def test_checkpoint_weights_only_roundtrip(tmp_path):
    mgr = checkpoint.CheckpointManager(tmp_path)
    path = mgr.save(_state(3), 3)
    loaded = torch.load(path, weights_only=True)  # plain torch can read it, no pickled objects
    assert loaded["step"] == 3 and set(loaded) >= {"model", "optimizer", "scheduler", "ema", "rng", "config"}
    assert (tmp_path / "step_00000003.pt.sha256").read_text() == \
        f"xxh3_128:{xxhash.xxh3_128(path.read_bytes()).hexdigest()}  step_00000003.pt\n"


def test_retention_keeps_last_two_plus_best_and_protected(tmp_path):
    mgr = checkpoint.CheckpointManager(tmp_path, keep_last=2)
    for step, metric in [(1, 0.5), (2, 0.9), (3, 0.6), (4, 0.7)]:
        mgr.save(_state(step), step, metric)
    names = sorted(p.name for p in tmp_path.glob("*.pt"))
    assert names == ["best.pt", "step_00000003.pt", "step_00000004.pt"]
    assert torch.load(tmp_path / "best.pt", weights_only=True)["step"] == 2 and mgr.best_metric == 0.9
    assert not (tmp_path / "step_00000001.pt.sha256").exists()
    resumed = checkpoint.CheckpointManager(tmp_path, keep_last=2)
    found = resumed.load_latest()
    assert found.state["step"] == 4 and found.path == tmp_path / "step_00000004.pt" and resumed.best_metric == 0.9
    resumed.protected = tmp_path / "step_00000003.pt"
    for step in (5, 6):
        resumed.save(_state(step), step)
    assert (tmp_path / "step_00000003.pt").exists(), "the file being resumed from must not be deleted"
    assert not (tmp_path / "step_00000004.pt").exists()


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "no_checksum"])
def test_damaged_newest_checkpoint_is_skipped(tmp_path, damage):
    mgr = checkpoint.CheckpointManager(tmp_path, keep_last=3)
    mgr.save(_state(1), 1)
    newest = mgr.save(_state(2), 2)
    payload = bytearray(newest.read_bytes())
    if damage == "truncate":
        newest.write_bytes(payload[: len(payload) // 2])
    elif damage == "bitflip":
        payload[len(payload) // 2] ^= 0x01
        newest.write_bytes(bytes(payload))
    else:
        newest.with_name(newest.name + ".sha256").unlink()
    with pytest.warns(UserWarning, match="跳过损坏的检查点"):
        path, state = checkpoint.CheckpointManager(tmp_path).load_latest()
    assert state["step"] == 1 and path.name == "step_00000001.pt"
    with pytest.raises(checkpoint.CorruptCheckpointError):
        checkpoint.load_verified(newest)


def test_should_save_by_steps_and_time(tmp_path, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(checkpoint.time, "monotonic", lambda: now[0])
    mgr = checkpoint.CheckpointManager(tmp_path, every_steps=10, every_seconds=60)
    assert mgr.should_save(10) and not mgr.should_save(11)
    now[0] += 61
    assert mgr.should_save(11)
    mgr.save(_state(11), 11)
    assert not mgr.should_save(12)


def test_restore_training_state_and_shape_mismatch():
    torch.manual_seed(0)
    model = build_model("small", width=8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3, 32, 32)).sum().backward()
    opt.step()
    state = checkpoint.training_state(model=model, optimizer=opt, epoch=1, step=7, batch_in_epoch=2)
    expected = torch.rand(2)
    fresh = build_model("small", width=8)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    meta = checkpoint.restore_training_state(state, model=fresh, optimizer=fresh_opt)
    assert (meta["epoch"], meta["step"], meta["batch_in_epoch"]) == (1, 7, 2)
    assert torch.equal(torch.rand(2), expected), "RNG state restored"
    assert fresh_opt.state_dict()["state"][0]["step"] == 1
    wider = build_model("small", width=16)
    with pytest.raises(ValueError, match="结构不一致") as info:
        checkpoint.restore_training_state(state, model=wider, optimizer=torch.optim.AdamW(wider.parameters()))
    assert "features.0.0.weight" in str(info.value)
    fp16 = torch.amp.GradScaler("cpu", enabled=True)
    with pytest.raises(ValueError, match="GradScaler"):
        checkpoint.restore_training_state({**state, "scaler": {}}, model=fresh, optimizer=fresh_opt, scaler=fp16)


# ---------------------------------------------------------------- monitor
def test_spike_detector():
    rng = np.random.default_rng(0)
    det = alerts.SpikeDetector()
    noise = 2.0 + 0.1 * rng.standard_normal(300)
    assert not any(det.update(v) for v in noise)
    assert det.update(6.0) and det.update(float("nan"))


def test_a_run_whose_first_losses_are_nan_alerts_without_a_median(tmp_path, capsys):
    mon = monitor.Monitor(tmp_path, flush_every=2, progress=False)
    for step in (1, 2, 3):
        mon.log_step(step, 0, torch.tensor(float("nan")), torch.tensor(float("inf")), torch.tensor(False), 0.1, 8,
                     skipped=True)
    mon.close()
    assert [a["step"] for a in mon.alerts if a["title"] == "loss spike"] == [1, 2, 3]
    assert "近期中位数 无" in mon.alerts[0]["text"]
    assert [r["step"] for r in monitor.read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_monitor_writes_records_and_truncates_on_resume(tmp_path, capsys):
    mon = monitor.Monitor(tmp_path, loggers=("jsonl", "tensorboard"), flush_every=4, progress=False)
    for step in range(1, 31):
        loss = torch.tensor(50.0 if step == 27 else 2.0 + 0.01 * (step % 3))
        mon.log_step(step, 0, loss, torch.tensor(0.5), torch.tensor(False), 0.1, 8)
    with mon.paused():
        mon.log_eval(30, 0, acc=0.5)
    mon.close()
    recs = monitor.read_metrics(tmp_path / "metrics.jsonl")
    train = [r for r in recs if r["split"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 31))
    assert {"loss", "loss_smooth", "grad_norm", "clipped", "lr", "samples_per_sec", "mem_peak_mb"} <= set(train[0])
    assert recs[-1] == {"split": "val", "step": 30, "epoch": 0, "acc": 0.5}
    assert any(a["step"] == 27 and a["title"] == "loss spike" for a in mon.alerts)
    assert "[ALERT] loss spike" in capsys.readouterr().out
    assert train[-1]["samples_per_sec"] > 0 and train[-1]["loss_smooth"] < 3
    assert list((tmp_path / "tensorboard").glob("events.*"))
    resumed = monitor.Monitor(tmp_path, flush_every=4, progress=False, resume_step=20)
    resumed.close()
    assert [r["step"] for r in monitor.read_metrics(tmp_path / "metrics.jsonl")] == list(range(1, 21))
    with pytest.raises(ValueError, match="logger"):
        monitor.Monitor(tmp_path, loggers=("mlflow",), progress=False)


# ---------------------------------------------------------------- debug / estimate / schedule
def test_overfit_one_batch_and_sanity_report():
    torch.manual_seed(0)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    model = build_model("tiny", width=8)
    report = debug.sanity_report(model, x, y)
    assert report["initial_loss_ok"] and report["params_without_grad"] == [] and sum(report["label_counts"]) == 16
    losses = debug.overfit_one_batch(model, x, y, steps=100)
    assert losses[-1] < 0.05 < losses[0]
    frozen = build_model("tiny", width=8)
    frozen.features[0].weight.register_hook(lambda g: torch.zeros_like(g))
    assert "features.0.weight" in debug.sanity_report(frozen, x, y)["params_without_grad"]


def test_estimate_reproduces_chapter_example(capsys):
    est = estimate.estimate_training_time(10_000, 3, 4, steps_per_sec=0.5, price_per_hour=2.4)
    assert est.hours == pytest.approx(4.1667, abs=1e-3) and est.total_steps == 7500 and est.cost == pytest.approx(10.0)
    trap = estimate.estimate_training_time(10_000, 3, 4, samples_per_sec=0.5)
    assert trap.hours == pytest.approx(16.667, abs=1e-2) and "单位陷阱" in capsys.readouterr().out
    with pytest.raises(ValueError):
        estimate.estimate_training_time(10_000, 3, 4)
    calls = []
    tp = estimate.measure_throughput(lambda: calls.append(1), batch_size=8, steps=50, warmup=5)
    assert len(calls) == 55 and tp.steps == 50 and tp.samples_per_sec == pytest.approx(8 * tp.steps_per_sec)


def test_schedule_warmup_then_cosine():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = schedule.make_scheduler(opt, warmup_steps=10, total_steps=100)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([schedule.lr_at(s, 1.0, 10, 100) for s in range(100)])
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0) and lrs[-1] < 0.11


def test_monitor_wandb_offline(tmp_path, monkeypatch, capfd):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_SILENT", raising=False)  # as in a learner's Jupyter: the quiet environment is not set
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    assert sinks.wandb_mode() == "offline"
    mon = monitor.Monitor(tmp_path, loggers=("wandb",), flush_every=2, progress=False, config={"lr": 0.1})
    for step in range(1, 5):
        mon.log_step(step, 0, torch.tensor(1.0), torch.tensor(0.5), False, 0.1, 8)
    mon.alert("test alert", "offline alerts must not crash")
    mon.close()
    run_id = (tmp_path / "wandb_run_id.txt").read_text()
    assert list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}")), "an offline run folder for `wandb sync`"
    out, err = capfd.readouterr()
    said = [line for line in (out + err).splitlines() if line.startswith("wandb")]
    assert len(said) == 1 and "offline 模式" in said[0] and run_id in said[0], said   # one line, no banner


def test_best_is_the_same_file_not_a_second_serialisation(tmp_path, monkeypatch):
    mgr = checkpoint.CheckpointManager(tmp_path, keep_last=1)
    saves = []
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda *a, **k: (saves.append(1), real_save(*a, **k))[1])
    newest = mgr.save(_state(1), 1, metric=0.5)
    assert len(saves) == 1, "best.pt must not be serialised a second time"
    best = tmp_path / "best.pt"
    assert os.path.samefile(best, newest), "a hard link where the file system allows it"
    assert checkpoint.load_verified(best)["step"] == 1
    mgr.save(_state(2), 2, metric=0.4)  # not better: step 1 is pruned, best keeps its bytes
    assert not newest.exists() and checkpoint.load_verified(best)["step"] == 1


def test_best_falls_back_to_a_copy_without_hard_links(tmp_path, monkeypatch):
    def no_links(*args):
        raise OSError("hard links not supported")
    monkeypatch.setattr(os, "link", no_links)
    mgr = checkpoint.CheckpointManager(tmp_path, keep_last=1)
    newest = mgr.save(_state(3), 3, metric=0.9)
    best = tmp_path / "best.pt"
    assert not os.path.samefile(best, newest) and best.read_bytes() == newest.read_bytes()
    assert checkpoint.load_verified(best)["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "best.pt.sha256", "step_00000003.pt",
                                                          "step_00000003.pt.sha256"]


def test_pruning_keeps_the_newest_and_never_touches_newer_files(tmp_path):
    """A fresh run in a folder whose higher step numbers are stale: its own files must survive."""
    stale = checkpoint.CheckpointManager(tmp_path, keep_last=2)
    stale.save(_state(40), 40)
    mgr = checkpoint.CheckpointManager(tmp_path, keep_last=2)
    for step in (4, 8, 12):
        mgr.save(_state(step), step)
    assert [p.name for p in mgr.checkpoints()] == ["step_00000008.pt", "step_00000012.pt", "step_00000040.pt"]


def test_last_good_is_kept_and_only_advanced_by_healthy_saves(tmp_path):
    mgr = checkpoint.CheckpointManager(tmp_path, keep_last=2, keep_last_good=True)
    for step, healthy in [(4, True), (8, True), (12, False), (16, False), (20, False)]:
        mgr.save(_state(step), step, healthy=healthy)
    names = sorted(p.name for p in tmp_path.glob("*.pt"))
    assert names == ["last_good.pt", "step_00000016.pt", "step_00000020.pt"]  # last 2 + last_good
    assert mgr.last_good_step() == 8 and checkpoint.load_verified(tmp_path / "last_good.pt")["step"] == 8
    found = mgr.load_last_good()
    assert found.path.name == "last_good.pt" and found.state["step"] == 8
    plain = checkpoint.CheckpointManager(tmp_path / "plain", keep_last=2)
    plain.save(_state(1), 1)
    assert not (tmp_path / "plain" / "last_good.pt").exists(), "only with keep_last_good (notebook 04's API)"


def test_set_aside_moves_newer_checkpoints_never_deletes(tmp_path):
    mgr = checkpoint.CheckpointManager(tmp_path, keep_last=3, keep_last_good=True)
    for step, metric in [(2, 0.1), (4, 0.2), (6, 0.3)]:
        mgr.save(_state(step), step, metric, healthy=step < 6)
    newest = tmp_path / "step_00000006.pt"
    damaged = bytearray(newest.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    os.unlink(newest)  # best.pt is a hard link to it: write a separate, damaged file
    newest.write_bytes(bytes(damaged))
    (tmp_path / "metrics.jsonl").write_text('{"step": 6}\n')
    resumed = checkpoint.CheckpointManager(tmp_path, keep_last=3, keep_last_good=True)
    with pytest.warns(UserWarning, match="跳过损坏的检查点"):
        assert resumed.load_latest().state["step"] == 4
    moved = resumed.set_aside(4, also_copy=(tmp_path / "metrics.jsonl",))
    assert sorted(str(p.relative_to(tmp_path)) for p in moved) == [
        "corrupt/step_00000006.pt", "superseded/best.pt", "superseded/metrics.jsonl"]
    assert (tmp_path / "corrupt" / "step_00000006.pt").read_bytes() == bytes(damaged)
    assert checkpoint.load_verified(tmp_path / "superseded" / "best.pt")["step"] == 6
    assert [p.name for p in resumed.checkpoints()] == ["step_00000002.pt", "step_00000004.pt"]
    assert resumed.last_good_step() == 4 and not (tmp_path / "best.pt").exists()
    assert resumed.set_aside(4) == [], "nothing newer left"


def test_leftovers_of_a_killed_save_are_removed(tmp_path):
    mgr = checkpoint.CheckpointManager(tmp_path)
    mgr.save(_state(3), 3)
    (tmp_path / ".step_00000006.pt.tmp-4242").write_bytes(b"half a checkpoint")
    (tmp_path / "step_00000001.pt.sha256").write_text("abc  step_00000001.pt\n")  # its checkpoint was pruned
    removed = sorted(p.name for p in mgr.remove_leftovers())
    assert removed == [".step_00000006.pt.tmp-4242", "step_00000001.pt.sha256"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003.pt", "step_00000003.pt.sha256"]


def test_a_failed_write_leaves_no_partial_file(tmp_path, monkeypatch):
    mgr = checkpoint.CheckpointManager(tmp_path)
    mgr.save(_state(1), 1)

    def disk_full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(checkpoint.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        mgr.save(_state(2), 2)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001.pt", "step_00000001.pt.sha256"]
    assert checkpoint.load_verified(tmp_path / "step_00000001.pt")["step"] == 1


def test_ema_leaves_integer_parameters_to_the_live_model():
    model = torch.nn.Linear(2, 2)
    model.register_parameter("count", torch.nn.Parameter(torch.tensor([3]), requires_grad=False))
    averaged = EMA(model, decay=0.9)
    averaged.update(model)
    with torch.no_grad():
        model.count.fill_(7)
        model.weight.add_(1.0)
    averaged.update(model)  # the fused lerp would raise on an integer tensor
    assert averaged.module.count.item() == 7
    assert torch.allclose(averaged.module.weight, model.weight - 0.9)


def test_monitor_sinks_each_receive_every_record(tmp_path):
    mon = monitor.Monitor(tmp_path, loggers=("tensorboard",), flush_every=2, progress=False)
    assert [type(s).__name__ for s in mon.sinks] == ["JsonlSink", "TensorBoardSink"]
    seen = []

    class Recorder:
        def write(self, record): seen.append(record["step"])
        def flush(self): seen.append("flush")
        def close(self): seen.append("close")

    mon.sinks.append(Recorder())
    for step in range(1, 4):
        mon.log_step(step, 0, torch.tensor(1.0), torch.tensor(0.5), False, 0.1, 8)
    mon.log_eval(3, 0, acc=0.5)
    mon.close()
    assert seen == [1, 2, "flush", 3, "flush", 3, "flush", "close"]
