"""course_utils.heartbeat without processes: who the watchdog names, its limit, torn reads, the straggler rule,
HangGuard's per-step block."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from course_utils import heartbeat
from course_utils.distributed import World
from course_utils.hang_guard import HangGuard
from course_utils.heartbeat import Heartbeat, read_heartbeats
from course_utils.runfolder import RunFiles
from course_utils.stragglers import Stragglers
from course_utils.watchdog import FIRST_STEP_GRACE_S, Watchdog
from tests.support.pro_runs import load_script


def published(tmp_path, rank: int, step: int, phase: str, since: float, stamped: float, job=("", "0")) -> Heartbeat:
    """Rank ``rank``'s heartbeat file as a live (or, with an old ``stamped``, frozen) rank would leave it."""
    beat = Heartbeat(rank)
    (tmp_path / "heartbeats").mkdir(exist_ok=True)
    beat.publish(tmp_path / "heartbeats" / f"rank_{rank}.hb", {"rank": rank, "pid": 1, "host": "h", "job": list(job)})
    beat.step, beat.phase, beat.since = step, phase, since
    with beat._lock:  # the file as of ``stamped``
        heartbeat._LIVE.pack_into(beat._map, 0, 7, step, heartbeat.PHASES.index(phase), since, stamped, 7)
    return beat


def watchdog(tmp_path, rank: int, step: int, phase: str, since: float, size: int = 2, timeout: float = 10) -> Watchdog:
    beat = Heartbeat(rank)
    beat.step, beat.phase, beat.since, beat.steps_done = step, phase, since, 5
    return Watchdog(beat, tmp_path, size, timeout=timeout)


def test_a_frozen_rank_is_named_even_when_everyone_is_in_the_same_phase(tmp_path):
    now = time.time()
    published(tmp_path, 1, 9, "save", since=now - 12, stamped=now - 12)  # frozen as it entered save
    report = watchdog(tmp_path, 0, 9, "save", since=now - 11.9).check(now)
    assert [(s["rank"], s["phase"], s["step"], s["frozen"]) for s in report.stuck] == [(1, "save", 9, True)]
    assert report.reporter == 0 and "rank 1 在 step 9 的 save 阶段" in report.message


def test_alive_but_blocked_the_rank_furthest_behind_is_named(tmp_path):
    now = time.time()
    published(tmp_path, 1, 5, "data", since=now - 20, stamped=now - 0.5)  # a stuck read: its watchdog still stamps
    report = watchdog(tmp_path, 0, 5, "allreduce", since=now - 19).check(now)
    assert [(s["rank"], s["phase"], s["frozen"]) for s in report.stuck] == [(1, "data", False)]


def test_progress_anywhere_is_no_hang_and_other_attempts_do_not_count(tmp_path):
    now = time.time()
    published(tmp_path, 1, 6, "forward", since=now - 1, stamped=now)
    assert watchdog(tmp_path, 0, 5, "allreduce", since=now - 30).check(now) is None, "rank 1 moved 1 s ago"
    published(tmp_path, 1, 6, "forward", since=now - 1, stamped=now, job=("old-run", "0"))
    report = watchdog(tmp_path, 0, 5, "allreduce", since=now - 30).check(now)
    assert [(s["rank"], s["phase"]) for s in report.stuck] == [(1, None)], "another job's file is no heartbeat"


def test_limit_auto_explicit_and_first_step_grace():
    beat = Heartbeat()
    dog = Watchdog(beat, "unused", 1, timeout=None)
    assert dog.limit() == FIRST_STEP_GRACE_S, "before a step is done: the grace"
    for t in range(10):
        beat.step_starts.append(100.0 + 5 * t)
    beat.steps_done = 9
    assert dog.limit() == 100.0, "20 x the median step of 5 s"
    beat.step_starts.clear()
    beat.step_starts.extend([0.0, 0.01, 0.02, 0.03])
    assert dog.limit() == 60.0, "at least 60 s"
    assert Watchdog(beat, "unused", 1, timeout=7).limit() == 7
    assert Watchdog(beat, "unused", 1, timeout=1e9).limit() == 1e9, "an explicit limit is not capped"


def test_torn_read_is_skipped(tmp_path):
    beat = published(tmp_path, 0, 3, "data", since=1.0, stamped=2.0)
    assert read_heartbeats(tmp_path / "heartbeats")[0]["phase"] == "data"
    heartbeat._LIVE.pack_into(beat._map, 0, 8, 3, 2, 1.0, 2.0, 7)  # a write in progress: seq 8 ... 7
    assert read_heartbeats(tmp_path / "heartbeats") == {}


def test_enter_publishes_at_once_and_times_per_phase_add_up(tmp_path):
    beat = published(tmp_path, 0, 0, "start", since=time.time(), stamped=time.time())
    beat.enter("data", 4)
    assert read_heartbeats(tmp_path / "heartbeats")[0]["phase"] == "data", "no wait for the next stamp"
    time.sleep(0.02)
    beat.enter("allreduce")
    time.sleep(0.03)
    times = beat.take_times()
    assert times["steps"] == 1 and 0.02 <= times["data"] < times["busy"] + 1e-9 and times["wait"] >= 0.03
    assert beat.phase == "allreduce" and beat.step == 4, "taking the times is not progress"


def test_hooks_enter_forward_backward_optimizer_in_training_only():
    model, seen = torch.nn.Linear(2, 1), []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    beat = Heartbeat()
    beat.on_enter = lambda step, phase: seen.append(phase)
    beat.attach(model, optimizer)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    model.eval()
    model(torch.ones(1, 2))
    assert seen == ["forward", "backward", "optimizer"]


@pytest.mark.parametrize("busy, flagged", [([0.020, 0.071], [1]), ([0.020, 0.028], []), ([0.002, 0.0045], [])])
def test_straggler_rule(busy, flagged):
    stragglers = Stragglers(window=20)
    found = []
    for _ in range(30):
        found += stragglers.update([{"steps": 1, "busy": b, "data": 0.0, "wait": 0.0} for b in busy])
    assert [rank for rank, _, _ in found] == flagged, "named once, after a full window (1.5x and 5 ms more)"


def test_a_straggler_is_named_through_slow_steps_of_every_rank():
    """Rank 1 is 40 ms slower in every step; two steps of the window are 0.45 s for both (a new epoch's workers
    starting). Its mean is 1.4x the other's, its median 1.8x: the median names it (the CI run of stop 47 missed)."""
    stragglers = Stragglers(window=20)
    found = []
    for step in range(20):
        busy = [0.45, 0.45] if step in (0, 15) else [0.050, 0.090]
        found += stragglers.update([{"steps": 1, "busy": b, "data": 0.0, "wait": 0.0} for b in busy])
    assert [(rank, round(busy, 3)) for rank, busy, _ in found] == [(1, 0.09)]


def test_hang_timeout_too_short_is_refused():
    script = load_script()
    with pytest.raises(SystemExit) as exc:
        script.parse_args(["--hang-timeout", "2"])
    assert exc.value.code == 2
    assert script.parse_args(["--hang-timeout", "0"]).hang_timeout == 0


def test_hang_guard_step_times_every_nth_step_and_lets_go_of_the_run_after_the_loop(tmp_path):
    """``HangGuard.step``: the "data" phase of the step at entry; at the end of every ``every``-th step rank 0's
    monitor gets the ranks' times, not after a step that raised; leaving the guard drops ``status`` (no reference
    cycle with the run's state) and this rank's heartbeat file."""
    model, logged = torch.nn.Linear(2, 1), []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = SimpleNamespace(log_ranks=lambda step, times: logged.append((step, times[0]["steps"])),
                              alert=lambda *args: None)
    phases = []
    with HangGuard(World(), RunFiles(tmp_path), None, model, optimizer, timeout=None, every=2, status=dict,
                   on_enter=lambda step, phase: phases.append((step, phase))) as guard:
        assert read_heartbeats(tmp_path / "heartbeats")[0]["phase"] == "start", "published on entry"
        for step in (1, 2, 3):
            with guard.step(step, monitor):
                model(torch.ones(1, 2)).sum().backward()
                optimizer.step()
        with pytest.raises(RuntimeError), guard.step(4, monitor):
            raise RuntimeError("a step that fails")
    assert logged == [(2, 2)], "step 2 only: step 4 raised, 1 and 3 are not multiples of every=2"
    assert phases[:4] == [(1, "data"), (1, "forward"), (1, "backward"), (1, "optimizer")] and phases[-1] == (4, "data")
    assert guard._status is None and not (tmp_path / "heartbeats").exists()
