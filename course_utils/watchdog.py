"""A hang watchdog: the failure that prints nothing, detected, named and ended.

What: a ``Watchdog`` thread in every rank stamps this rank's heartbeat file (``course_utils.heartbeat``)
about once a second (alive) and reads every rank's. When no rank has made progress for ``limit()``
seconds, every live rank dumps the stacks of all its threads (``faulthandler``) into
``hangs/<time>-step<N>/`` (``RunFiles.hangs``), the lowest live rank writes ``report.json`` there (a
``HangReport``) and calls ``on_hang`` (the script writes status.json "hung"), frozen ranks on this machine
and every rank's DataLoader workers are killed, and each process ends with ``ExitCode.HUNG`` (124, as
``timeout(1)``).

Why: gloo waits 30 minutes by default in a collective whose partner is gone, nothing prints, and the
job's bill keeps running.

Pitfalls handled:
- A frozen rank cannot report itself: its watchdog is frozen too, so its file stops being stamped.
  That is how the others name it (``frozen``); a rank that is alive but blocked (a stuck read) keeps
  refreshing its file and is named as the one that is furthest behind (step, then ``PHASES`` order).
- Start-up and the first step are slow (workers start, the first checkpoint): the limit is at least
  ``FIRST_STEP_GRACE_S`` until this process has finished a step.
- The limit must cover the slowest thing one rank does between two heartbeats: a checkpoint save
  (one beat) or an evaluation batch (one beat per batch).
- A pid in a heartbeat may have been reused: a process is killed only when its environment names this
  torchrun job.

Example::

    beat = Heartbeat(rank)
    with Watchdog(beat, run_folder, world_size, timeout=None, on_hang=write_hung_status):
        for step in ...:
            beat.enter("data", step); x, y = next(batches)
            ...

Reference machinery of ``solutions/homework/train_cifar_pro.py`` (through ``course_utils.hang_guard``);
11 §10 freezes a rank of it and reads the report (``course_tools/lab/hangs.py``).
"""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from course_utils.heartbeat import PHASES, Heartbeat, read_heartbeats
from course_utils.runfolder import ExitCode, RunFiles

__all__ = ["FIRST_STEP_GRACE_S", "AUTO_MAX_S", "HangReport", "Watchdog"]

FIRST_STEP_GRACE_S = 120.0
AUTO_MIN_S, AUTO_STEPS, AUTO_MAX_S = 60.0, 20, 1500.0  # auto limit: 20 × the median step, within [60 s, 25 min]


@dataclass
class HangReport:
    """What the watchdog found: the stuck ranks (rank, phase, step, seconds since their last heartbeat,
    frozen: their watchdog stopped too), the limit it used, the folder of the stacks, a one-line message."""

    limit_s: float
    stuck: list[dict[str, Any]]
    folder: str
    reporter: int
    message: str = ""
    ranks: list[dict[str, Any]] = field(default_factory=list)


class Watchdog:
    """A daemon thread: writes this rank's heartbeat file, and ends the job when no rank has made progress
    for ``limit()`` seconds (see the module docstring). ``timeout`` None: the automatic limit; 0: off.

    Pitfall: it ends the process with ``os._exit``: nothing after the last checkpoint is kept (the same as
    ``kill -9``; ``--resume`` continues exactly from that checkpoint).
    """

    def __init__(self, beat: Heartbeat, folder: str | os.PathLike | RunFiles, world_size: int, *,
                 timeout: float | None, on_hang: Callable[[HangReport], None] | None = None) -> None:
        files = RunFiles.of(folder)
        self.beat, self.size, self.timeout, self.on_hang = beat, world_size, timeout, on_hang
        self.dir, self.hangs = files.heartbeats, files.hangs
        self.mine = self.dir / f"rank_{beat.rank}.hb"
        self.job = os.environ.get("TORCHELASTIC_RUN_ID", ""), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)

    def limit(self) -> float:
        """Seconds without progress that make a hang: ``timeout``, or 20 × the median step within [60 s, 25 min];
        at least ``FIRST_STEP_GRACE_S`` until this process has finished a step."""
        median = self.beat.median_step_s()
        limit = self.timeout or min(max(AUTO_MIN_S, AUTO_STEPS * (median or 0.0)), AUTO_MAX_S)
        return limit if self.beat.steps_done else max(limit, FIRST_STEP_GRACE_S)

    def poll_s(self) -> float:
        return min(1.0, max(0.1, self.limit() / 20))

    def __enter__(self) -> "Watchdog":
        if self.timeout != 0:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.beat.publish(self.mine, {"rank": self.beat.rank, "pid": os.getpid(), "host": socket.gethostname(),
                                          "job": list(self.job)})
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        """A normal way out: the thread stops, this rank's file goes (a heartbeat file left = not ended cleanly)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.beat.close()
        for path in (self.mine, self.dir):
            try:
                path.unlink() if path == self.mine else path.rmdir()  # the folder goes with the last rank
            except OSError:
                pass

    def read(self) -> dict[int, dict[str, Any]]:
        """Every rank's heartbeat of this job attempt (rank -> record); a rank without one is missing."""
        beats = read_heartbeats(self.dir)
        return {r: b for r, b in beats.items() if r < self.size and tuple(b["job"]) == self.job}

    def check(self, now: float | None = None) -> HangReport | None:
        """A report when no rank has made progress for ``limit()`` seconds, else None."""
        now, limit = time.time() if now is None else now, self.limit()
        beats = self.read()
        beats[self.beat.rank] = {"rank": self.beat.rank, "step": self.beat.step, "phase": self.beat.phase,
                                 "since": self.beat.since, "stamped": now, "pid": os.getpid(),
                                 "host": socket.gethostname()}
        if now - max(b["since"] for b in beats.values()) < limit:
            return None
        stale = max(2.0, 4 * self.poll_s())
        ranks = [{"rank": r, "phase": b["phase"], "step": b["step"], "seconds": round(now - b["since"], 1),
                  "frozen": now - b["stamped"] > stale, "pid": b["pid"], "host": b["host"]}
                 for r, b in sorted(beats.items())]
        missing = [{"rank": r, "phase": None, "step": None, "seconds": None, "frozen": True, "pid": None,
                    "host": None} for r in range(self.size) if r not in beats]
        frozen = [r for r in ranks if r["frozen"]] + missing
        if frozen:
            stuck = frozen
        else:
            behind = min((r["step"], PHASES.index(r["phase"])) for r in ranks)
            stuck = [r for r in ranks if (r["step"], PHASES.index(r["phase"])) == behind]
        reporter = min(r["rank"] for r in ranks if not r["frozen"])
        newest = max(b["since"] for b in beats.values())
        name = time.strftime("%Y%m%d-%H%M%S", time.localtime(newest)) + f"-step{max(r['step'] for r in ranks)}"
        report = HangReport(limit, stuck, str(self.hangs / name), reporter, ranks=ranks + missing)
        who = ";".join(f"rank {r['rank']}" + (" 没有心跳" if r["phase"] is None else
                       f" 在 step {r['step']} 的 {r['phase']} 阶段已 {r['seconds']:.0f} 秒没有前进")
                       + (",进程已冻结" if r["frozen"] else "") for r in stuck)
        report.message = (f"卡住(hang): {limit:.0f} 秒内没有任何进程前进。{who}。各进程的线程栈在 {name}/;"
                          "检查该进程(数据读取、DataLoader worker、设备)后用 --resume 从最后一个检查点继续")
        return report

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s()):
            try:
                self.beat.stamp()
                report = self.check()
            except OSError:  # a full disk or a folder gone: try again at the next poll
                continue
            if report is not None and not self._stop.is_set():
                self.end(report)

    def end(self, report: HangReport) -> None:
        """Dump this process's stacks, report (the lowest live rank), kill what cannot leave by itself, exit."""
        folder = Path(report.folder)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"stacks_rank{self.beat.rank}.txt", "w") as f:
            f.write(f"rank {self.beat.rank} pid {os.getpid()}: step {self.beat.step}, phase {self.beat.phase}\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        if report.reporter == self.beat.rank:
            (folder / "report.json").write_text(json.dumps(asdict(report), indent=2, ensure_ascii=False) + "\n")
            if self.on_hang is not None:
                self.on_hang(report)
            print(report.message, file=sys.stderr)
            host = socket.gethostname()
            for r in report.stuck:
                if r["frozen"] and r["pid"] and r["host"] == host and _same_job(r["pid"], self.job):
                    _kill_tree(r["pid"])
            live = [r["rank"] for r in report.ranks if not r["frozen"] and r["rank"] != self.beat.rank]
            deadline = time.monotonic() + 5  # the others' stacks before this process goes (torchrun then stops them)
            while time.monotonic() < deadline and not all((folder / f"stacks_rank{r}.txt").exists() for r in live):
                time.sleep(0.05)
        for child in _children(os.getpid()):  # DataLoader workers: a stopped one would never leave
            _kill(child)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ExitCode.HUNG)


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux ``/proc``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _kill_tree(pid: int) -> None:
    for child in _children(pid):
        _kill(child)
    _kill(pid)


def _same_job(pid: int, job: tuple[str, str]) -> bool:
    """``pid`` is a rank of this job (its torchrun run id), not a process that reused the number."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"TORCHELASTIC_RUN_ID={job[0]}".encode() in environ and bool(job[0])
