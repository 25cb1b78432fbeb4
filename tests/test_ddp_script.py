"""solutions/homework/train_cifar_pro.py under torchrun: CPU, gloo, 2 processes of one thread each (issue 16).

- the reference run: every rank's RNG state in the checkpoints, only rank 0's files, global samples/s;
- exact resume: every process of the job (the torchrun agent, the ranks it starts in their own
  sessions, their DataLoader workers) SIGKILLed at 5+ random moments, one inside a save; no process
  survives a kill; the resumed run's per-step losses equal the reference's (==);
- SIGTERM to rank 1 alone: every rank stops at the same step, one save, status "preempted";
- 2 -> 1 -> 2 processes with a per-sample ledger: every step trains on the same global batch, every
  sample of an epoch exactly once. Bit equality is not expected: one process sums the 32 per-sample
  losses and gradients in one order, two processes sum 16 + 16 and then add the two halves
  (floating-point addition is not associative), so the last bits differ and the runs drift apart slowly;
- two launchers (``--nnodes 2``, c10d rendezvous over loopback) give the single-launcher run bit for bit.

The reference is the session's uninterrupted single-launcher job (``ddp_reference``, tests/conftest.py), which the
hang tests compare with too.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import torch

from course_utils.checkpoint import load_verified
from course_utils.data import epoch_order, load_cifar10, take_fraction
from course_utils.monitor import read_metrics
from tests.support.pro_runs import STEPS_PER_EPOCH, finish, newest_checkpoint, status, train_losses, train_records
from tests.support.torchrun_jobs import MARKER, TOTAL_STEPS as TOTAL, job_processes, kill_job, launch

pytestmark = [pytest.mark.slow, pytest.mark.fresh_interpreter]  # torchrun starts real interpreters: their start-up is tested


def incomplete_saves(out: Path) -> set[str]:
    """What an unfinished save leaves in ``checkpoints/``: hidden temp files, ``step_*.pt`` without its checksum."""
    try:
        names = set(os.listdir(out / "checkpoints"))
    except OSError:
        return set()
    return {n for n in names if n.startswith(".") or n.startswith("step_") and n.endswith(".pt")
            and n + ".sha256" not in names}


def save_in_progress(out: Path, after: int, ignore: set[str]) -> bool:
    """A checkpoint of a step after ``after`` is being written (``.step_<N>.pt.tmp-<pid>`` or no checksum yet);
    ``ignore``: leftovers of earlier kills (the next start removes them)."""
    return any(int(n.lstrip(".")[5:13]) > after for n in incomplete_saves(out) - ignore
               if n.lstrip(".").startswith("step_"))


def running_job_step(out: Path, job: str) -> int:
    """The last step logged by the job ``job`` (0 until its rank 0 has started: records of an earlier, killed
    job may still be in ``metrics.jsonl`` until then)."""
    try:
        environ = Path(f"/proc/{status(out)['pid']}/environ").read_bytes()
    except (OSError, ValueError, KeyError):
        return 0
    if f"{MARKER}={job}".encode() not in environ:
        return 0
    records = train_losses(out)
    return records[-1][0] if records else 0


def wait_until(proc: subprocess.Popen, condition, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the job ended before the moment was reached:\n{proc.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, "the moment was not reached in time"
        time.sleep(0.001)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_launchers(tmp_path_factory):
    """Multi-node as documented (``--nnodes 2 --rdzv-backend c10d --rdzv-endpoint HOST:PORT``), both "nodes" on
    this machine, one rank each."""
    out, endpoint, run_id = tmp_path_factory.mktemp("ddp") / "reference", f"127.0.0.1:{free_port()}", uuid.uuid4().hex
    launcher = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                "--rdzv-id", run_id]
    nodes = [launch(out, launcher=launcher)[0] for _ in range(2)]
    return out, [finish(node, 300) for node in nodes]


def test_reference_run(ddp_reference):
    assert [step for step, _ in train_losses(ddp_reference)] == list(range(1, TOTAL + 1))
    assert status(ddp_reference)["state"] == "finished" and status(ddp_reference)["world_size"] == 2
    state = load_verified(ddp_reference / "checkpoints" / f"step_{TOTAL:08d}.pt")
    assert state["world_size"] == 2 and len(state["rng_ranks"]) == 2
    assert not torch.equal(state["rng_ranks"][0]["torch"], state["rng_ranks"][1]["torch"]), "a stream per rank"
    assert not any(k.startswith("module.") for k in state["model"]), "the unwrapped model is saved"
    files = {str(p.relative_to(ddp_reference)) for p in ddp_reference.rglob("*") if p.is_file()}
    assert files == {"config.json", "metrics.jsonl", "status.json", "run.lock", *(
        f"checkpoints/{name}{ext}" for name in ("best.pt", "last_good.pt", f"step_{TOTAL - 3:08d}.pt",
                                                f"step_{TOTAL:08d}.pt") for ext in ("", ".sha256"))}, \
        "rank 0 alone writes, once (no per-rank copies, no leftovers)"
    records = train_records(ddp_reference)
    assert all(r["samples_per_sec"] for r in records[2:]), "throughput of the global batch"


def test_sigkill_of_the_whole_job_at_random_moments_then_resume_is_exact(ddp_reference, tmp_path):
    out, rng = tmp_path / "killed", random.Random(16)
    plan = ["inside a save", "random step", "random time", "random step", "random time"]
    kills = []
    while len(kills) < len(plan) or not any(inside for *_, inside in kills):
        assert len(kills) < len(plan) + 3, f"no kill landed inside a save: {kills}"
        moment = plan[len(kills)] if len(kills) < len(plan) else "inside a save"
        resumed = newest_checkpoint(out)
        proc, job = launch(out, *(["--resume"] if kills else []))
        started = time.monotonic()
        before = incomplete_saves(out)
        if moment == "inside a save":  # not the first save: a valid checkpoint is left to resume from
            wait_until(proc, lambda: save_in_progress(out, max(resumed, 3), before))
        elif moment == "random step":
            target = resumed + rng.randint(1, 5)
            wait_until(proc, lambda: running_job_step(out, job) >= target)
        else:  # often during start-up (process group, data), sometimes in the first steps
            delay = rng.uniform(0.2, 5.0)
            wait_until(proc, lambda: time.monotonic() - started > delay)
        killed = kill_job(proc, job)
        kills.append((moment, round(time.monotonic() - started, 2), killed, bool(incomplete_saves(out) - before)))
    print("kills (moment, s after launch, processes killed, inside a save):", kills)
    proc, _ = launch(out, "--resume")
    code, output = finish(proc, 300)
    assert code == 0 and "续训" in output, f"{kills}\n{output[-3000:]}"
    assert train_losses(out) == train_losses(ddp_reference), f"kills (moment, s, processes, inside a save): {kills}"
    assert max(killed for _, _, killed, _ in kills) >= 5, "agent + 2 ranks + their DataLoader workers"


@pytest.fixture(scope="module")
def resized(tmp_path_factory):
    """One run: 2 processes, SIGTERM to rank 1; resumed with 1 process, SIGTERM; resumed with 2 to the end."""
    out = tmp_path_factory.mktemp("ddp") / "resized"
    stops, outputs = [], []
    for nproc, stop_after in ((2, 4), (0, 6), (2, None)):
        proc, job = launch(out, "--sample-ledger", *(["--resume"] if stops else []), nproc=nproc)
        if stop_after is not None:
            target = (stops[-1] if stops else 0) + stop_after
            wait_until(proc, lambda: train_losses(out) and train_losses(out)[-1][0] >= target)
            ranks = {p: info for p, info in job_processes(job).items() if info["ppid"] == str(proc.pid)}
            victim = next(p for p, info in ranks.items() if info["RANK"] == "1") if nproc else proc.pid
            os.kill(victim, signal.SIGTERM)
        code, output = finish(proc, 300)
        outputs.append(output)
        stops.append(status(out)["step"])
        if stop_after is not None:
            assert status(out)["state"] == "preempted", output[-3000:]
            assert code == (1 if nproc else 75), "torchrun folds the ranks' 75 into 1: status.json tells"
    return out, stops, outputs


def test_sigterm_to_one_rank_stops_all_at_one_step_saved_once(resized):
    out, (first, _, _), outputs = resized
    assert "SIGTERM(rank 1)" in outputs[0] and "SIGTERM(rank 0)" not in outputs[0], outputs[0][-2000:]
    ledger = read_metrics(out / "sample_ledger.jsonl")
    assert [len(r["indices"]) for r in ledger if r["step"] <= first] == [2] * first, "both ranks trained every step"
    records = train_losses(out)
    assert sorted(step for step, _ in records) == list(range(1, TOTAL + 1)), "every step logged once"
    assert f"已在 step {first} 保存检查点" in outputs[0] and f"从 step_{first:08d}.pt 续训" in outputs[1]


def test_changing_the_number_of_processes_keeps_batches_and_sample_order(resized):
    out, (first, second, end), outputs = resized
    assert end == TOTAL and status(out)["state"] == "finished"
    assert "检查点由 2 个进程保存,现在是 1 个" in outputs[1] and "检查点由 1 个进程保存,现在是 2 个" in outputs[2]
    ledger = read_metrics(out / "sample_ledger.jsonl")
    assert [r["step"] for r in ledger] == list(range(1, TOTAL + 1)), "each step once: nothing replayed or skipped"
    worlds = [1 if first < r["step"] <= second else 2 for r in ledger]
    assert [r["world_size"] for r in ledger] == worlds and [len(r["indices"]) for r in ledger] == worlds
    train = take_fraction(load_cifar10(True, quiet=True), 0.1)
    batch = 32
    for epoch in range(2):
        order = epoch_order(len(train), 0, epoch).tolist()
        records = [r for r in ledger if (r["step"] - 1) // STEPS_PER_EPOCH == epoch]
        seen = [i for r in records for share in r["indices"] for i in share]
        assert len(seen) == len(set(seen)) == STEPS_PER_EPOCH * batch, f"epoch {epoch}: every sample exactly once"
        for r in records:
            k = (r["step"] - 1) % STEPS_PER_EPOCH
            assert [i for share in r["indices"] for i in share] == order[k * batch:(k + 1) * batch], \
                f"step {r['step']}: the global batch of a single process, whoever computes it"
            assert [len(share) for share in r["indices"]] == [batch // r["world_size"]] * r["world_size"]
            assert [y for share in r["labels"] for y in share] == [train.targets[i] for share in r["indices"]
                                                                   for i in share], "the samples trained on"


def test_resized_run_drifts_only_in_the_last_bits(resized, ddp_reference):
    """Same data, same weights at the switch: only the summation order differs (see the module docstring)."""
    out, (first, second, _), _ = resized
    ours, theirs = dict(train_losses(out)), dict(train_losses(ddp_reference))
    assert all(ours[s] == theirs[s] for s in range(1, first + 1)), "2 processes, uninterrupted: bit for bit"
    after_switch = [abs(ours[s] - theirs[s]) for s in range(first + 1, TOTAL + 1)]
    assert max(after_switch[:2]) < 1e-5 and max(after_switch) < 1e-3, after_switch


def test_two_launchers_over_loopback_equal_one_launcher(two_launchers, ddp_reference):
    """One rank 0 in the job, on one node; its losses equal the single launcher's, every step bit for bit."""
    out, results = two_launchers
    assert all(code == 0 for code, _ in results), [output[-2000:] for _, output in results]
    assert sum("processes=2" in output for _, output in results) == 1, "one rank 0 in the job, on one node"
    assert train_losses(out) == train_losses(ddp_reference)
