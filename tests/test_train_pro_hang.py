"""Hangs (issue 34): the professional script's watchdog names the stuck rank and its phase, ends the job, and the
job resumes exactly; a slow rank is reported, not killed; a stuck DataLoader worker of a plain run is caught.

Rank 1 freezes itself (SIGSTOP, ``--inject-stall``) as it enters a phase: its watchdog thread freezes with it,
which is what a stuck process looks like from outside. The torchrun jobs carry ``torchrun_jobs.MARKER``, so
"no process of the job left" counts only this test's processes.
"""
from __future__ import annotations

import json
import random
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from course_tools import cputime
from tests.support.pro_runs import finish, status, train_losses
from tests.support.torchrun_jobs import job_processes, launch

pytestmark = [pytest.mark.slow, pytest.mark.fresh_interpreter]  # real interpreters: the start of an attempt is timed
TIMEOUT = 6  # --hang-timeout of these tests: a tiny step is ~15 ms, the slowest beat (start of an attempt) < 2 s
SAVES = sorted({3 * k for k in range(1, 11)} | {15, 30})  # ARGS: --ckpt-every-steps 3, epochs of 15 steps


def hang_reports(out: Path) -> list[dict]:
    return [json.loads((folder / "report.json").read_text()) for folder in sorted((out / "hangs").iterdir())]


def last_save_before(step: int) -> int:
    return max([s for s in SAVES if s < step], default=0)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict:
    """Every hang job of this file at once (they mostly wait: for a limit, for each other), each finished:
    name -> (out, exit code, output, job marker)."""
    root, plan = tmp_path_factory.mktemp("hang"), restart_plan()
    stalls = ",".join(f"1:{step}:{phase}:1" for step, phase in plan)
    specs = {"restarts": (("--resume", "--hang-timeout", str(TIMEOUT), "--inject-stall", stalls),
                          {"launcher": ["--standalone", "--nproc-per-node", "2", "--max-restarts", "3"]}),
             "once": (("--hang-timeout", str(TIMEOUT), "--inject-stall", "1:5:data:1"), {}),
             "worker": (("--hang-timeout", str(TIMEOUT), "--inject-stuck-worker", "150"), {"nproc": 0})}
    started = {name: (root / name, *launch(root / name, *args, **kw)) for name, (args, kw) in specs.items()}
    with ThreadPoolExecutor(len(started)) as pool:  # read every job's output at once: no pipe fills up
        done = dict(zip(started, pool.map(lambda s: finish(s[1], 300), started.values())))
    results = {name: (out, *done[name], job) for name, (out, _, job) in started.items()}
    results["plan"] = plan
    return results


def restart_plan() -> list[tuple[int, str]]:
    """(step, phase) of attempt i's stall: a random step, not the first of its attempt, which resumes from the
    last save before the previous stall; a save stall on a step that saves."""
    rng, plan, start = random.Random(34), [], 0
    for phase in ("data", "backward", "save"):
        step = rng.choice([s for s in range(start + 2, start + 8) if phase != "save" or s in SAVES])
        plan.append((step, phase))
        start = last_save_before(step)
    return plan


def test_frozen_rank_in_data_backward_and_save_is_named_and_torchrun_restarts_it_exactly(jobs, ddp_reference):
    """One job, ``--max-restarts 3``: attempt i freezes rank 1 in phase i at a random step. Each attempt ends as
    hung within --hang-timeout + 10 s, the report names rank 1 (frozen), the phase and the step, and the last
    attempt's losses equal the uninterrupted run's."""
    (out, code, output, job), plan = jobs["restarts"], jobs["plan"]
    assert code == 0, f"{plan}\n{output[-4000:]}"
    reports = hang_reports(out)
    assert [(r["stuck"][0]["step"], r["stuck"][0]["phase"]) for r in reports] == plan, (plan, reports)
    for report in reports:
        (stuck,) = report["stuck"]
        assert stuck["rank"] == 1 and stuck["frozen"], report
        assert TIMEOUT <= stuck["seconds"] <= TIMEOUT + 10, report
        assert report["reporter"] == 0 and report["limit_s"] == TIMEOUT
        folder = Path(report["folder"])
        assert "rank 1" in report["message"] and stuck["phase"] in report["message"]
        stacks = (folder / "stacks_rank0.txt").read_text()
        assert "Thread" in stacks and "train_cifar_pro.py" in stacks, "every thread of the live rank, dumped"
        assert not (folder / "stacks_rank1.txt").exists(), "a frozen rank dumps nothing: it is named by the others"
    assert output.count("卡住(hang)") == 3 and output.count("续训") == 3, output[-3000:]
    assert train_losses(out) == train_losses(ddp_reference), plan
    assert status(out)["state"] == "finished" and not (out / "heartbeats").exists()
    assert not job_processes(job), "no process of the job is left"


def test_hung_job_without_restarts_ends_with_status_hung_and_no_process_left(jobs):
    """Without --max-restarts torchrun folds the exit code into 1: status.json says hung, with exit code 124."""
    out, code, output, job = jobs["once"]
    assert code == 1 and "exitcode  : 124" in output, output[-3000:]
    state = status(out)
    assert state["state"] == "hung" and state["exit_code"] == 124 and state["step"] == 4, state
    assert [(s["rank"], s["phase"], s["step"]) for s in state["stuck"]] == [(1, "data", 5)]
    assert Path(state["hang_folder"]).is_dir()
    assert not job_processes(job), "the frozen rank and every DataLoader worker were killed"


def test_stuck_dataloader_worker_of_a_plain_run_is_caught_and_the_resume_is_exact(jobs, reference):
    """A plain run (no torchrun): its only DataLoader worker freezes mid-epoch. The watchdog (a thread of the main
    process, which waits in its data phase) ends the run with exit code 124, kills the worker, and --resume
    continues exactly."""
    out, code, output, job = jobs["worker"]
    assert code == 124, output[-3000:]
    state = status(out)
    assert state["state"] == "hung" and [(s["rank"], s["phase"], s["frozen"]) for s in state["stuck"]] == \
        [(0, "data", False)], state
    stacks = next((out / "hangs").iterdir()) / "stacks_rank0.txt"
    assert "_try_get_data" in stacks.read_text(), "the main thread's stack shows where it waits"
    assert not job_processes(job), "the frozen worker was killed"
    code, output = finish(launch(out, "--resume", nproc=0)[0], 120)
    assert code == 0, output[-3000:]
    assert train_losses(out) == train_losses(reference)


def test_straggler_is_reported_not_killed_and_nothing_trips_beside_cpu_hogs(tmp_path):
    """Rank 1 sleeps 50 ms in every data phase, two CPU hogs beside the job (one per core on the 2-core machine), the default --hang-timeout:
    the run finishes, rank 1 is named a straggler once, and each rank's times are in metrics.jsonl."""
    out = tmp_path / "straggler"
    with cputime.cpu_hogs(2):
        code, output = finish(launch(out, "--inject-straggler", "1:0.05")[0], 300)
    assert code == 0 and status(out)["state"] == "finished", output[-3000:]
    assert not (out / "hangs").exists(), "the default limit never trips on a healthy, busy job"
    alerts = [line for line in output.splitlines() if "[ALERT] straggler" in line]
    assert len(alerts) == 1 and "rank 1 持续偏慢" in alerts[0], output[-3000:]
    ranks = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"ranks"' in line]
    assert [r["step"] for r in ranks] == list(range(1, 31)), "one record per --log-every step"
    assert all(r["data"][1] >= 0.05 for r in ranks), "rank 1's sleep is in its data phase"
    assert statistics.median(r["data"][0] for r in ranks) < 0.05, ranks[:3]
    assert sum(r["wait"][0] for r in ranks) > sum(r["wait"][1] for r in ranks), "rank 0 waits for rank 1"
