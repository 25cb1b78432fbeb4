"""The professional script under misuse (issue 14's "Done when" list): no hang, no silent mix-up, no lost run.

Each test is what people actually do: resume with another batch size, forget --resume in a
finished folder, start a second run in the same folder, send SIGTERM to the whole process
group, blow up the lr and resume with a smaller one, train on a truncated real data file,
fill the disk. Runs are tiny (15 steps per epoch); independent runs go side by side.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import time

import pytest
import torch

from course_utils.checkpoint import load_verified, save_verified
from course_utils.schedule import lr_at
from tests.support.pro_runs import REFERENCE as BASE
from tests.support.pro_runs import REFERENCE_STEPS as TOTAL
from tests.support.pro_runs import (TINY, fake_cifar, finish, last_step, listing, run, run_all,
                            start, status, train_losses, train_records, wait_for_step)

pytestmark = pytest.mark.slow
# BASE: 2 epochs = 30 steps; checkpoints at 4, 8, ..., 28, the epoch ends (15: eval + best) and 30.
# ``reference``, the session's uninterrupted run of BASE (finished), is what the other runs here are compared with.


def copy_of(run_folder, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(run_folder, target)
    return target


def max_abs_weight(path) -> float:
    state = load_verified(path)
    return max(v.abs().max().item() for v in state["model"].values() if v.is_floating_point())


def test_resume_with_a_larger_batch_is_refused_within_seconds(reference, tmp_path):
    out = copy_of(reference, tmp_path)
    before = listing(out)
    code, output = run(out, *BASE, "--resume", "--batch-size", "64", timeout=30, interpreter="forked")
    # refused before any training: one line, nothing written (a wall-clock bound here failed beside CPU hogs, 10.2 s)
    assert code == 2 and "batch_size 32 → 64" in output and len(output.strip().splitlines()) == 1, output
    assert listing(out) == before, "a refusal changes nothing"


def test_forgotten_resume_and_overwrite_keep_every_run(reference, tmp_path):
    out = copy_of(reference, tmp_path)
    before = {k: (out / k).read_bytes() for k in listing(out)}
    code, output = run(out, *BASE, interpreter="forked")  # --resume forgotten in a finished folder
    assert code == 2 and "--resume" in output and "--overwrite" in output, output
    code, output = run(out, *BASE, "--overwrite", "--seed", "1", "--max-steps", "4", interpreter="forked")
    assert code == 0 and "改名" in output, output
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert len(aside) == 1
    assert {k: (aside[0] / k).read_bytes() for k in before} == before, "the old run, byte for byte"
    assert [s for s, _ in train_losses(out)] == [1, 2, 3, 4] and status(out)["state"] == "finished"
    code, output = run(out, *BASE, "--max-steps", "4", "--resume", "--seed", "0",
                       interpreter="forked")  # the old seed: another run
    assert code == 2 and "seed 1 → 0" in output, output


def test_all_corrupt_checkpoints_are_kept_aside_and_the_run_starts_over(reference, tmp_path):
    out = copy_of(reference, tmp_path)
    damaged = {}
    for path in sorted((out / "checkpoints").glob("*.pt")):  # best.pt and last_good.pt may share bytes with a step file
        payload = bytearray(path.read_bytes())
        payload[len(payload) // 2] ^= 0xFF
        path.unlink()
        path.write_bytes(bytes(payload))
        damaged[path.name] = bytes(payload)
    old_metrics = (out / "metrics.jsonl").read_bytes()
    # leftovers of a kill during a save
    (out / "checkpoints" / ".step_00000032.pt.tmp-99999").write_bytes(b"half")
    (out / "checkpoints" / "step_00000002.pt.sha256").write_text("0" * 64 + "  step_00000002.pt\n")
    (out / ".metrics.jsonl.tmp-99999").write_text("{}")
    code, output = run(out, *BASE, "--resume", interpreter="forked")
    assert code == 0 and "跳过损坏的检查点" in output and "从 step 0 开始" in output, output
    kept = sorted(p.read_bytes() for p in (out / "checkpoints").glob("*/*.pt"))  # corrupt/, superseded/
    assert kept == sorted(damaged.values()), "every damaged file is kept aside, byte for byte"
    assert (out / "checkpoints" / "superseded" / "metrics.jsonl").read_bytes() == old_metrics
    assert train_losses(out) == train_losses(reference), "the restarted run is the same run"
    top = sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_file())
    assert top == ["best.pt", "best.pt.sha256", "last_good.pt", "last_good.pt.sha256", "step_00000028.pt",
                   "step_00000028.pt.sha256", "step_00000030.pt", "step_00000030.pt.sha256"], top
    assert not list(out.glob(".*.tmp-*")), "leftovers removed"


def test_a_checkpoint_of_another_run_is_refused_and_nothing_moves(reference, tmp_path):
    out = copy_of(reference, tmp_path)
    foreign = load_verified(out / "checkpoints" / "step_00000030.pt")
    foreign["config"]["hparams"]["seed"] = 1  # as if copied in from a seed-1 run
    save_verified(foreign, out / "checkpoints" / "step_00000031.pt")
    before = listing(out)
    code, output = run(out, *BASE, "--resume", timeout=120, interpreter="forked")
    refusal = [line for line in output.splitlines() if "拒绝运行" in line]
    assert code == 2 and len(refusal) == 1 and "step_00000031.pt" in refusal[0] and "seed 1 → 0" in refusal[0], output
    assert listing(out) == before, "nothing was moved, pruned or rewritten"


def test_a_second_run_in_the_same_folder_is_refused_and_a_restart_after_sigkill_is_not(
        reference, tmp_path):
    out = tmp_path / "run"
    first = start(out, *BASE, "--workers", "2", interpreter="forked")
    try:
        wait_for_step(first, out, 6)  # past the checkpoint at step 4
        code, output = run(out, *BASE, "--resume", timeout=60, interpreter="forked")
        assert code == 2 and f"pid {first.pid}" in output, output
        first.send_signal(signal.SIGKILL)  # its DataLoader workers outlive it for a few seconds
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
    code, output = run(out, *BASE, "--workers", "2", "--resume", interpreter="forked")  # at once
    assert code == 0 and "续训" in output, output
    assert train_losses(out) == train_losses(reference)


def _claimed(proc, out) -> bool:
    """The run holds its folder (its signal handler is installed by then) and is still starting up."""
    lock = out / "run.lock"
    return lock.exists() and f"pid {proc.pid} @" in lock.read_text()


def test_sigterm_to_the_process_group_with_2_workers_saves_10_of_10(reference, tmp_path):
    """Two chains side by side, five SIGTERMs each (start-up, the first flush, mid-epoch, the epoch-end eval
    and save, just after a resume...), every one to the whole process group; then each chain finishes.
    Targets stay several steps before the end: a signal during the last step ends a finished run."""
    chains = {"a": [None, 3, 15, None, 21], "b": [1, 8, 12, 16, 20]}  # None: during start-up
    outs = {name: tmp_path / name for name in chains}
    saved = {name: [] for name in chains}
    for round_ in range(5):
        procs = {name: start(out, *BASE, "--workers", "2", "--log-every", "1", *(["--resume"] if round_ else []),
                             start_new_session=True, interpreter="forked") for name, out in outs.items()}
        waiting, deadline = set(procs), time.monotonic() + 180
        while waiting:  # both chains at once: each gets its signal as soon as it reaches its target
            for name in sorted(waiting):
                proc, out, target = procs[name], outs[name], chains[name][round_]
                assert proc.poll() is None, f"{name} ended before its target {target}: {proc.stdout.read()}"
                if _claimed(proc, out) if target is None else last_step(out) >= target:
                    os.killpg(proc.pid, signal.SIGTERM)
                    waiting.discard(name)
            assert time.monotonic() < deadline, f"targets not reached: {waiting}"
            time.sleep(0.01)
        for name, proc in procs.items():
            code, output = finish(proc, 120)
            out = outs[name]
            assert code == 75 and "已在 step" in output and "Traceback" not in output, (name, round_, output)
            state = status(out)
            assert state["state"] == "preempted" and state["exit_code"] == 75, state
            step = state["step"]
            assert step == last_step(out) and step < TOTAL
            assert load_verified(out / "checkpoints" / f"step_{step:08d}.pt")["step"] == step
            saved[name].append(step)
    results = run_all([(out, [*BASE, "--workers", "2", "--log-every", "1", "--resume"]) for out in outs.values()],
                      interpreter="forked")
    for (code, output), out in zip(results, outs.values()):
        assert code == 0, output
        assert train_losses(out) == train_losses(reference), f"preempted at {saved}"


def test_lr_explosion_resumes_from_the_last_good_checkpoint_with_the_new_lr(tmp_path):
    out = tmp_path / "run"
    args = [*TINY, "--epochs", "3", "--ckpt-every-steps", "4", "--log-every", "3"]
    code, output = run(out, *args, "--max-steps", "24", interpreter="forked")
    assert code == 0, output
    code, output = run(out, *args, "--max-steps", "45", "--resume", "--lr", "1e4", "--allow-change", "lr",
                       "--allow-change", "max_steps", interpreter="forked")
    state = status(out)
    assert code == 3 and state["state"] == "stopped_bad_steps" and state["last_good_step"] == 24, output
    assert "last_good.pt(step 24)" in output and "--allow-change lr" in output, output
    blown = [p for p in (out / "checkpoints").glob("step_*.pt") if int(p.stem[5:]) > 24]
    assert blown and all(max_abs_weight(p) > 1e3 for p in blown), "the checkpoints after the blow-up are garbage"
    assert max_abs_weight(out / "checkpoints" / "last_good.pt") < 10
    blown_bytes = sorted(p.read_bytes() for p in blown)

    code, output = run(out, *args, "--max-steps", "45", "--resume", "--lr", "3e-3", "--allow-change", "lr",
                       interpreter="forked")
    assert code == 0 and "从 last_good.pt 续训: step 24" in output, output
    assert sorted(p.read_bytes() for p in (out / "checkpoints" / "superseded").glob("step_*.pt")) == blown_bytes
    records = {r["step"]: r for r in train_records(out)}
    assert sorted(records) == list(range(1, 46))
    assert [records[s]["lr"] for s in range(25, 46)] == pytest.approx([lr_at(s, 3e-3, 5, 45) for s in range(24, 45)])
    assert all(records[s]["loss"] < 5 for s in range(25, 46))
    for path in (out / "checkpoints").glob("*.pt"):
        assert max_abs_weight(path) < 10, path.name
    history = [h["changes"] for h in json.loads((out / "config.json").read_text())["history"]]
    assert history == [{"max_steps": [24, 45], "lr": [3e-3, 1e4]}, {"lr": [1e4, 3e-3]}]


@pytest.mark.fresh_interpreter  # its own COURSE_DATA
def test_a_truncated_real_data_file_stops_the_run(tmp_path):
    fake_cifar(tmp_path / "data", truncate="data_batch_1")
    proc = start(tmp_path / "run", *BASE, env={**os.environ, "COURSE_DATA": str(tmp_path / "data")},
                 interpreter="fresh")
    code, output = finish(proc, 120)
    assert code == 1 and "data_batch_1" in output and "Traceback" not in output, output
    assert status(tmp_path / "run")["state"] == "failed"
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.fresh_interpreter  # its own file-size limit, set before the script starts
def test_a_full_disk_gives_one_line_with_the_path_and_keeps_the_checkpoints(reference, tmp_path):
    out = copy_of(reference, tmp_path)
    newest = (out / "checkpoints" / "step_00000030.pt").read_bytes()

    def small_disk():  # writes past 100 kB fail with EFBIG (Python ignores SIGXFSZ): a checkpoint is ~210 kB
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
    proc = start(out, *BASE, "--resume", "--epochs", "3", "--allow-change", "epochs", preexec_fn=small_disk,
                 interpreter="fresh")
    code, output = finish(proc, 120)
    lines = [line for line in output.splitlines() if line.startswith("失败")]
    assert code == 1 and len(lines) == 1 and "Traceback" not in output, output
    assert str(out / "checkpoints") in lines[0] and "最新: step 30" in lines[0], lines[0]
    assert status(out)["state"] == "failed"
    assert (out / "checkpoints" / "step_00000030.pt").read_bytes() == newest
    assert not list((out / "checkpoints").glob(".*.tmp-*")), "no partial file left behind"


def test_nan_every_other_step_stops_on_the_rate_not_the_streak(tmp_path):
    nan_steps = "3,5,7,9,11,13,15,17"
    (code, output), (code_short, output_short) = run_all([
        (tmp_path / "rate", [*BASE, "--max-steps", "20", "--inject-nan-at-step", nan_steps]),
        (tmp_path / "window2", [*BASE, "--max-steps", "20", "--inject-nan-at-step", nan_steps,
                                "--max-bad-steps", "2", "--bad-step-window", "2"])], interpreter="forked")
    assert code == 3 and status(tmp_path / "rate")["step"] == 11, output  # the 5th bad step in 50
    assert "5 个坏步" in output
    assert code_short == 0, output_short  # never 2 bad steps within 2: the window decides


def test_an_unavailable_device_is_one_line(tmp_path):
    code, output = run(tmp_path / "run", *BASE, "--device", f"cuda:{torch.cuda.device_count() + 7}", timeout=120,
                       interpreter="forked")
    refusal = [line for line in output.splitlines() if "拒绝运行" in line]
    assert code == 2 and len(refusal) == 1 and "--device cuda:" in refusal[0] and "Traceback" not in output, output


