"""``--on-spike rollback`` in the professional script (issue 22): back to last_good.pt, the data skipped, on the record.

The spikes are made with the script's hidden probes. ``--inject-bad-batch`` poisons global batches
(corrupted data: a rollback that skips them cures the run). A recurring blow-up is a real one:
``--lr 1e4`` from a resume, which each rollback meets again.

- one shared reference run with two rollbacks (``rolled``), and beside it the same spikes with
  ``--on-spike stop`` and the start of the blow-up run, all three at once;
- SIGKILL as a rollback begins (twice), at a random step between them, and just after the second (its
  records then taken back: as if killed between its checkpoint and its records), each time ``--resume``:
  the per-step losses, the rollback events, status.json's history and the skip file equal the reference's;
- 2 gloo processes under torchrun (slow): killed the same way, equal to their own uninterrupted run,
  both ranks skip the same global batches, and the skip file is the single process's;
- the skipped batches are exactly the positions named (healthy checkpoint .. bad batch + margin), their
  samples are ``course_utils.data.epoch_order``'s, and the run never trains them;
- the recurring blow-up ends in the documented stop (exit code 3) after ``--max-rollbacks``.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from course_utils.data import epoch_order, load_cifar10, take_fraction
from course_utils.monitor import read_metrics
from course_utils.rollback import SKIPPED_FILE
from course_utils.schedule import lr_at
from tests.support.pro_runs import (STEPS_PER_EPOCH, TINY, command, finish, load_script, run, run_all, status, train_losses,
                             wait_for_step)
from tests.support.torchrun_jobs import kill_job, launch

pytestmark = pytest.mark.slow  # every test here starts the script: out of the quick loop

BATCH, SEED = 32, 0  # TINY's batch and seed
BASE = [*TINY, "--epochs", "2", "--ckpt-every-steps", "4", "--log-every", "3"]
# bad batches at positions 9-11 (steps 10-12) and 24-26; 3 bad steps in a window of 10 raise the alarm
SPIKES = ["--inject-bad-batch", "9,10,11,24,25,26", "--max-bad-steps", "3", "--bad-step-window", "10"]
ROLLBACK = [*BASE, *SPIKES, "--on-spike", "rollback", "--skip-batches", "2", "--rollback-lr-factor", "0.5"]
# Rollback 1: alarm at step 12, back to step 8 (last_good), skip positions 8..11+2; step s then trains position s+5.
# Rollback 2: positions 24-26 are steps 19-21, alarm at 21, back to step 16 (20 is not healthy), skip 22..26+2.
SKIPPED = [*range(8, 14), *range(22, 29)]
TRAJECTORY = [*range(0, 8), *range(14, 22), *range(29, 43)]  # the position each step 1..30 trains
TOTAL = 2 * STEPS_PER_EPOCH
ALARMS = {1: 12, 2: 21}  # rollback number -> the step whose alarm starts it
BLOW_UP = [*TINY, "--epochs", "3", "--ckpt-every-steps", "4", "--log-every", "3", "--on-spike", "rollback",
           "--max-rollbacks", "2", "--skip-batches", "1"]


def events(out: Path) -> list[dict]:
    """The rollback events, without the time they took (a rollback a resume finished records none)."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in read_metrics(out / "metrics.jsonl")
            if r.get("event") == "rollback"]


def record_of(out: Path) -> tuple:
    """Everything a rollback run must reproduce after kills: losses, events, status history, the skip file."""
    return train_losses(out), events(out), status(out).get("history"), (out / SKIPPED_FILE).read_text()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, int, str]]:
    """name -> (folder, exit code, output): the rollback reference (with a per-step sample ledger), the same spikes
    with --on-spike stop, and the first 8 healthy steps of the blow-up run, side by side."""
    root = tmp_path_factory.mktemp("rollback")
    jobs = {"rolled": [*ROLLBACK, "--sample-ledger"], "stopped": [*BASE, *SPIKES, "--on-spike", "stop"],
            "blow-up": [*BLOW_UP, "--max-steps", "8"]}
    results = run_all([(root / name, args) for name, args in jobs.items()], interpreter="forked")
    return {name: (root / name, code, output) for name, (code, output) in zip(jobs, results)}


@pytest.fixture(scope="module")
def rolled(runs) -> Path:
    out, code, output = runs["rolled"]
    assert code == 0 and status(out)["state"] == "finished", output[-3000:]
    return out


def test_two_rollbacks_on_the_record(rolled):
    assert [s for s, _ in train_losses(rolled)] == list(range(1, TOTAL + 1)), "one record per step, as on a resume"
    assert [(e["number"], e["bad_step"], e["restored_step"], e["first_position"], e["last_position"], e["step"])
            for e in events(rolled)] == [(1, 12, 8, 8, 13, 8), (2, 21, 16, 22, 28, 16)]
    assert all(e["seconds"] > 0 for e in read_metrics(rolled / "metrics.jsonl") if e.get("event") == "rollback")
    assert status(rolled)["history"] == [
        {"state": "rolled_back", "step": 12, "to_step": 8, "skipped_positions": [8, 13], "lr_factor": 0.5},
        {"state": "rolled_back", "step": 21, "to_step": 16, "skipped_positions": [22, 28], "lr_factor": 0.5}]
    assert (rolled / "checkpoints" / "superseded" / "step_00000020.pt").exists(), "the abandoned trajectory kept"


def test_the_lr_is_scaled_at_each_rollback(rolled):
    """The schedule goes on (no step of the trajectory is skipped as non-finite), times 0.5 per rollback."""
    lr = {r["step"]: r["lr"] for r in read_metrics(rolled / "metrics.jsonl") if r.get("split") == "train"}
    scale = {s: 1.0 if s <= 8 else 0.5 if s <= 16 else 0.25 for s in range(1, TOTAL + 1)}
    assert [lr[s] for s in range(1, TOTAL + 1)] == pytest.approx([scale[s] * lr_at(s - 1, 3e-3, 5, TOTAL)
                                                                  for s in range(1, TOTAL + 1)], rel=1e-9)


def test_skipped_batches_are_exactly_the_named_ones_and_never_trained(rolled):
    written = json.loads((rolled / SKIPPED_FILE).read_text())
    assert sorted(map(int, written["positions"])) == SKIPPED and written["skipped_batches"] == len(SKIPPED)
    n = len(take_fraction(load_cifar10(True, quiet=True), 0.1))

    def batch(position: int) -> list[int]:  # the global batch at a position, from the data order itself
        epoch, k = divmod(position, STEPS_PER_EPOCH)
        return epoch_order(n, SEED, epoch).tolist()[k * BATCH:(k + 1) * BATCH]
    assert all(written["positions"][str(p)] == batch(p) for p in SKIPPED)
    # the ledger has a line per executed step, abandoned ones included: the last line of a step is the trajectory's
    trained = {r["step"]: r["indices"][0] for r in read_metrics(rolled / "sample_ledger.jsonl")}
    assert sorted(trained) == list(range(1, TOTAL + 1))
    assert [trained[s] for s in range(1, TOTAL + 1)] == [batch(p) for p in TRAJECTORY]


def kill_when(proc: subprocess.Popen, seen) -> None:
    """Read the run's (unbuffered) output until ``seen(line)``, then SIGKILL it."""
    output = []
    for line in proc.stdout:
        output.append(line)
        if seen(line):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"the moment never came:\n{''.join(output)[-3000:]}"


def alarm_line(number: int):
    """The alert of the bad step that starts rollback ``number``: printed just before the rollback begins."""
    return lambda line: f"step {ALARMS[number]}: loss/梯度出现 inf/NaN" in line


def after_rollback(line: str) -> bool:
    return "[ALERT] rolled back" in line  # the rollback's last act: it is saved and on the record


def unwrite_the_records(out: Path) -> None:
    """Take back what the newest rollback wrote after its checkpoint: its event, the skip file, status's history."""
    records = read_metrics(out / "metrics.jsonl")
    newest = max(r["number"] for r in records if r.get("event") == "rollback")
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records
                                               if r.get("event") != "rollback" or r["number"] != newest))
    (out / SKIPPED_FILE).unlink()
    (out / "status.json").write_text(json.dumps({k: v for k, v in status(out).items() if k != "history"}))


def test_sigkill_during_and_after_rollbacks_then_resume_equals_the_uninterrupted_run(rolled, tmp_path):
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # each alert reaches the test when it is printed
    target = random.Random(22).randint(ALARMS[1] + 1, ALARMS[2] - 1)  # after rollback 1 (replayed), before 2
    for moment in ("as rollback 1 begins", "at a random step", "as rollback 2 begins", "just after rollback 2"):
        proc = subprocess.Popen(command(out, *ROLLBACK, *(["--resume"] if out.exists() else [])), env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if moment == "at a random step":
            wait_for_step(proc, out, target)
            proc.kill()
            proc.communicate()
        else:
            kill_when(proc, {"as rollback 1 begins": alarm_line(1), "as rollback 2 begins": alarm_line(2),
                             "just after rollback 2": after_rollback}[moment])
    unwrite_the_records(out)  # as if the last kill had come between the rollback's checkpoint and its records
    code, output = run(out, *ROLLBACK, "--resume", interpreter="forked")
    assert code == 0 and "续训" in output, output[-3000:]
    assert record_of(out) == record_of(rolled), f"killed at step {target} once"


def test_stop_is_unchanged_and_the_default(runs, rolled):
    out, code, output = runs["stopped"]
    state = status(out)
    assert code == 3 and state["state"] == "stopped_bad_steps" and state["step"] == 12, output[-3000:]
    assert state["last_good_step"] == 8 and "history" not in state and "回滚" not in output
    assert not (out / SKIPPED_FILE).exists() and not events(out)
    assert train_losses(out)[:8] == train_losses(rolled)[:8], "the same run up to the healthy checkpoint"
    assert load_script().parse_args(["--out", str(out)]).on_spike == "stop"


def test_the_rollback_flags_are_the_runs_identity(rolled, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(rolled, copy)
    for args, field in (([*BASE, *SPIKES, "--on-spike", "stop"], "on_spike"),
                        ([*ROLLBACK, "--skip-batches", "3"], "skip_batches"),
                        ([*ROLLBACK, "--rollback-lr-factor", "0.1"], "rollback_lr_factor"),
                        ([*ROLLBACK, "--max-rollbacks", "1"], "max_rollbacks")):
        code, output = run(copy, *args, "--resume", interpreter="forked")
        assert code == 2 and f"{field} " in output and "--resume 被拒绝" in output, output


def test_a_recurring_lr_blow_up_stops_after_max_rollbacks_as_stop_does(runs):
    out, code, output = runs["blow-up"]
    assert code == 0, output[-3000:]
    code, output = run(out, *BLOW_UP, "--max-steps", "45", "--resume", "--lr", "1e4", "--allow-change", "lr",
                       "--allow-change", "max_steps", interpreter="forked")
    state = status(out)
    assert code == 3 and state["state"] == "stopped_bad_steps" and state["exit_code"] == 3, output[-3000:]
    assert [h["to_step"] for h in state["history"]] == [8, 8] and state["last_good_step"] == 8
    assert "已回滚 2 次(--max-rollbacks 2)" in state["message"] and output.count("[ALERT] rolled back") == 2
    assert [e["number"] for e in events(out)] == [1, 2]
    assert len(json.loads((out / SKIPPED_FILE).read_text())["rollbacks"]) == 2


# ------------------------------------------------------------------ 2 gloo processes under torchrun
DDP = ROLLBACK  # after test_ddp_script's ARGS, so its own (--ckpt-every-steps 4, --log-every 3) win


@pytest.fixture(scope="module")
def ddp_rolled(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rollback-ddp") / "reference"
    proc, _ = launch(out, *DDP, "--sample-ledger")
    code, output = finish(proc, 300)
    assert code == 0 and status(out)["world_size"] == 2, output[-3000:]
    return out


@pytest.mark.slow
def test_two_processes_roll_back_together_and_resume_exactly_after_sigkill(ddp_rolled, rolled, tmp_path,
                                                                          monkeypatch):
    assert (ddp_rolled / SKIPPED_FILE).read_text() == (rolled / SKIPPED_FILE).read_text(), "the same skip set"
    assert [e["step"] for e in events(ddp_rolled)] == [e["step"] for e in events(rolled)]
    ledger = {r["step"]: r for r in read_metrics(ddp_rolled / "sample_ledger.jsonl")}
    single = {r["step"]: r for r in read_metrics(rolled / "sample_ledger.jsonl")}
    assert all(len(ledger[s]["indices"]) == 2 for s in ledger), "both ranks trained every step"
    assert [sum(ledger[s]["indices"], []) for s in sorted(ledger)] == [single[s]["indices"][0] for s in sorted(single)]

    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    out = tmp_path / "killed"
    for seen in (alarm_line(1), after_rollback):
        proc, job = launch(out, *DDP, *(["--resume"] if out.exists() else []))
        assert any(seen(line) for line in proc.stdout), "the moment never came"
        kill_job(proc, job)
    proc, _ = launch(out, *DDP, "--resume")
    code, output = finish(proc, 300)
    assert code == 0, output[-3000:]
    assert record_of(out) == record_of(ddp_rolled)
