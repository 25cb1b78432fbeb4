"""Running a learner's homework scripts: the launcher, one run, watching runs side by side, the script's error.

Reference machinery of the homework checks (:mod:`course_tools.checks.nb10_homework`). A check starts each
:class:`Run` through a :class:`Launcher` (``LOCAL``, or the grader's sandbox) with :func:`run_environ`, and
:func:`watch` waits for all of them, stopping at an error once the other runs have ended or ``_SETTLE`` s passed
(the first failed run in order is reported, so a regrading says the same), at a step past the limit, or at
``CPU_LIMIT`` CPU seconds (limits in CPU time give the same verdict on a busy machine). When a script stops
early, the failure shows the script's own error (:func:`script_error`), not a consequence of it. Example::

    with scratch(None, "config") as tmp:
        runs = [Run(script, ["--seed", "1234", "--max-steps", "3"], tmp, "a", "--seed 1234 的运行")]
        run_all(runs, limit=3)
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol

from course_tools.checks import CheckFailed, expect, fail
from course_tools.checks import untrusted_files as files
from course_tools.cputime import WALL_FACTOR, cpu_clock
from course_tools.noninteractive import quiet_environ
from course_utils.data import default_data_root
from course_utils.resume_doctor import probe

__all__ = ["RECORDS", "CPU_LIMIT", "Launcher", "LOCAL", "run_environ", "script_path", "script_error", "scratch", "announce", "Run",
           "watch", "run_all"]

RECORDS = ".resume_doctor"  # the probe's records, inside the run's folder
CPU_LIMIT = 60      # CPU seconds for one run of a script (a check's run takes a few); WALL_FACTOR x this in wall time
_POLL = 0.05        # seconds between looks at the running scripts
_CLOCK_EVERY = 0.5  # seconds between readings of their CPU clocks
_SETTLE = 5.0       # seconds the other runs get to exit once one has failed (the first in order is reported)
_TAIL = 6           # log lines shown when no error line can be recognised


class Launcher(Protocol):
    """How a check starts one run of a learner's script.

    ``argv[0]`` is the Python executable, ``argv[1]`` the script. ``writable`` is the run's own
    folder (its ``--out``, created by the check before the launch): the only host path the
    process may write. Output goes to ``stdout`` (stderr merged). The process returned must die
    with everything it started on ``os.killpg(proc.pid, SIGKILL)``.
    """

    def __call__(self, argv: list[str], *, cwd: Path, env: dict[str, str], stdout: IO,
                 writable: Path) -> subprocess.Popen: ...


def _launch_local(argv: list[str], *, cwd: Path, env: dict[str, str], stdout: IO,
                  writable: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT, env=env,
                            cwd=cwd, start_new_session=True)


LOCAL: Launcher = _launch_local  # a plain subprocess in its own session (the learner's own machine)


def run_environ() -> dict[str, str]:
    """The environment of every run."""
    # One thread per process: the checks run two or three scripts side by side (two threads per process on a busy
    # 2-core machine are several times slower: bench/threads.py). The data is always the
    # stand-in (a data root without CIFAR-10), as in the grader: an epoch of the small run is 16 steps everywhere.
    return {**quiet_environ(), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "COURSE_DATA": str(default_data_root() / "checks")}


def script_path(path: str | os.PathLike) -> Path:
    p = Path(path).resolve()
    expect(p.is_file(), f"脚本 {p.name} 存在", f"找不到 {p}", "文件名和位置要与本节约定一致")
    return p


# ------------------------------------------------------------------ the script's own error

_ARGPARSE = re.compile(r"^(?:usage: .*|.*: error: (?P<msg>.*))$")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')


def script_error(text: str, folder: Path) -> tuple[str, list[str]]:
    """The script's own error as one short line, and the flags argparse did not recognise.

    argparse: its ``error:`` line. A traceback: the exception line and the innermost frame
    in the learner's folder. Otherwise the last lines of the output.
    """
    lines = [line.split("\r")[-1].rstrip() for line in text.splitlines()]
    lines = [line for line in lines if line.strip()]
    for line in reversed(lines):
        m = _ARGPARSE.match(line)
        if m and m.group("msg"):
            unknown = re.match(r"unrecognized arguments: (.*)", m.group("msg"))
            flags = [t for t in unknown.group(1).split() if t.startswith("--")] if unknown else []
            return line.strip(), flags
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if starts:
        block = lines[starts[-1]:]
        exc = next((line.strip() for line in reversed(block) if not line.startswith((" ", "\t"))), block[-1])
        where = ""
        for i, line in enumerate(block):
            m = _FRAME.match(line)
            if m and Path(m.group("file")).resolve().parent == folder:
                code = block[i + 1].strip() if i + 1 < len(block) and not _FRAME.match(block[i + 1]) else ""
                where = f"(位置: {Path(m.group('file')).name} 第 {m.group('line')} 行" + (f" `{code}`" if code else "") + ")"
        return exc + where, []
    return " | ".join(line.strip() for line in lines[-_TAIL:]) or "没有任何输出", []


# ------------------------------------------------------------------ running scripts

@contextlib.contextmanager
def scratch(workdir: Path | None, name: str) -> Iterator[Path]:
    """The folder of one check's runs: a fresh one under ``workdir`` (kept), or a temporary one."""
    if workdir is None:
        with tempfile.TemporaryDirectory() as tmp:
            yield Path(tmp)
    else:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        yield Path(tempfile.mkdtemp(prefix=f"{name}-", dir=workdir))


def announce(*scripts: Path) -> None:
    """The first line of every check: the absolute path of each script it runs."""
    print("运行: " + "、".join(str(s) for s in scripts))


_SIGKILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)  # a process killed by SIGKILL; through bwrap, 128 + 9


class Run:
    """One run of a learner's script: command, log file and run folder (``--out``).

    ``kill_after``: the run is SIGKILLed right after its ``kill_after``-th optimizer step, inside
    its own process (:mod:`course_utils.interrupt`, through the resume doctor's probe, which records every step into
    ``record``); the check kills it when ``metrics.jsonl``
    shows a later step only if the script steps no ``torch.optim`` optimizer (``polled``).
    """

    def __init__(self, script: Path, args: list[str], workdir: Path, name: str, what: str,
                 launcher: Launcher | None = None, log_name: str | None = None, kill_after: int | None = None,
                 record: bool = False) -> None:
        self.script, self.what, self.kill_after = script, what, kill_after
        self.launcher = launcher or LOCAL
        self.advice = ""  # said before the reproduce command when the script stops with an error
        self.out = workdir / name
        self.log = workdir / f"{log_name or name}.log"
        self.args = ["--out", str(self.out), *args]
        # record: the resume doctor's probe writes every optimizer step here (in the run's folder: the only one it may write)
        self.record = self.out / RECORDS / f"{log_name or name}.jsonl" if record or kill_after is not None else None
        self.proc: subprocess.Popen | None = None
        self.polled = False   # killed by the check on seeing a step past kill_after in the log (not by the step hook)
        self.cpu = lambda: 0.0
        self._handle = None

    def start(self) -> Run:
        self.out.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.log, "w", encoding="utf-8")
        argv = [sys.executable, str(self.script), *self.args]
        if self.record is not None:  # the probe records, and kills after step kill_after through course_utils.interrupt
            self.record.parent.mkdir(parents=True, exist_ok=True)
            kill = ["--kill", str(self.kill_after)] if self.kill_after is not None else []
            argv[1:1] = [probe.__file__, "--record", str(self.record), *kill, "--"]
        self.proc = self.launcher(argv, cwd=self.script.parent, env=run_environ(), stdout=self._handle, writable=self.out)
        self.cpu = cpu_clock(self.proc)
        return self

    def poll(self) -> int | None:
        return self.proc.poll()

    def killed_as_planned(self) -> bool:
        """It ended by the SIGKILL the check planned (after step ``kill_after``, or by the fallback poll)."""
        return self.kill_after is not None and (self.polled or self.proc.poll() in _SIGKILLED)

    def kill(self) -> None:
        """SIGKILL the script and whatever it started (data-loader workers): a ``kill -9``."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (AttributeError, ProcessLookupError, PermissionError):
                self.proc.kill()
        if self.proc is not None:
            self.proc.wait()
        if self._handle is not None:
            self._handle.close()

    def command(self) -> str:
        """The command line, to rerun by hand (the run folder shown as ``runs/hw_check``)."""
        args = ["runs/hw_check" if a == str(self.out) else a for a in self.args]
        return " ".join(["python", self.script.name, *args])

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""

    def records(self) -> list[dict[str, Any]]:
        try:
            return files.read_records(self.out / "metrics.jsonl")
        except CheckFailed:  # polled while running: a refused file is reported when the check reads it
            return []

    def train_steps(self) -> dict[int, dict[str, Any]]:
        """The training records on disk now, by step (lenient: for watching a run, not for a verdict)."""
        return {r["step"]: r for r in self.records()
                if isinstance(r, dict) and r.get("split", "train") == "train" and isinstance(r.get("step"), int)}

    def max_step(self) -> int:
        return max(self.train_steps(), default=0)

    def crashed(self) -> bool:
        """The output holds a traceback or an argparse error (not a failure the script reports itself)."""
        text = self.output()
        return "Traceback (most recent call last)" in text or bool(re.search(r"^\S+: error: ", text, re.MULTILINE))


_SIBLING_WAIT = 60.0  # s: how long the runs beside an argparse failure may take to pass or fail argparse


def _unknown_in_all(failed: Run, unknown: list[str], siblings: list[Run]) -> list[str]:
    """Every flag the check passes that the script does not know, not only the first run's.

    The runs of one check start side by side with different flags; whichever fails first must
    not decide what the hint names. Each sibling either passes argparse (it logs a record),
    exits, or runs out of ``_SIBLING_WAIT``; the flags of those that failed argparse are added,
    in the order of the longest command line.
    """
    others = [r for r in siblings if r is not failed]
    deadline = time.monotonic() + _SIBLING_WAIT
    while any(r.poll() is None and not r.records() for r in others) and time.monotonic() < deadline:
        time.sleep(_POLL)
    missing = set(unknown)
    for r in others:
        if r.poll() not in (None, 0):
            missing.update(script_error(r.output(), r.script.parent)[1])
    runs = sorted((failed, *others), key=lambda r: -len(r.args))  # the fullest command line sets the order
    order = [a for r in runs for a in r.args if a.startswith("--")]
    return sorted(missing, key=lambda flag: order.index(flag) if flag in order else len(order))


def _early_exit(run: Run, rc: int, ok: bool = True, siblings: list[Run] = ()) -> None:
    """Fail with the script's own error: what a learner needs when the script stops early."""
    error, unknown = script_error(run.output().replace(str(run.out), "runs/hw_check"), run.script.parent)
    if unknown:
        unknown = _unknown_in_all(run, unknown, list(siblings))
    expected = f"{run.what} 正常结束(退出码 0)" if ok else f"{run.what} 跑完全程(报告结果,不崩溃)"
    if unknown:
        hint = (f"脚本还不认识 {' '.join(unknown)}:按本节末尾“约定”加上这些参数(检查正是这样调用脚本的)。"
                f"复现: {run.command()}")
    elif "error:" in error and "Traceback" not in run.output():
        hint = f"参数的名字、类型或取值与本节末尾的约定不一致。复现: {run.command()}"
    else:
        hint = f"这是你的脚本自己的报错;{run.advice}在终端里复现: {run.command()}"
    fail(expected, f"退出码 {rc}: {error}", hint)


def _too_many_steps(run: Run, limit: int, resumed: bool = False) -> None:
    hint = (f"--max-steps 是总步数: 续训进程也在 step {limit} 停下" if resumed
            else "训练满 --max-steps 步就结束整个训练: 连 epoch 循环一起跳出")
    fail(f"{run.what} 在 step {limit} 结束(--max-steps {limit})", f"metrics.jsonl 里已经出现 step {run.max_step()}", hint)


def _over_time(run: Run, wall: bool) -> None:
    if wall:
        fail(f"{run.what} 在 {WALL_FACTOR * CPU_LIMIT} s 内结束", f"超时: {WALL_FACTOR * CPU_LIMIT} s 后仍在运行,"
             f"只用了 {run.cpu():.0f} s CPU 时间: 它在等待(sleep、input() 或卡住的读写)",
             f"检查的运行只有几十步,几秒就能跑完。复现: {run.command()}")
    fail(f"{run.what} 用不到 {CPU_LIMIT} s CPU 时间(检查的运行只有几十步)", f"超时: 已用 {run.cpu():.0f} s CPU 时间,还没结束",
         f"是不是没有在 --max-steps 处停下,或者用了完整的数据和模型?复现: {run.command()}")


def _failed(run: Run, rc: int | None, ok: bool) -> bool:
    return rc is not None and not run.killed_as_planned() and (rc != 0 if ok else run.crashed())


def _first_failure(runs: list[Run], ok: bool) -> None:
    """Once every run has exited or ``_SETTLE`` s have passed, fail with the first run in ``runs``' order that failed.

    Why: runs that all fail at start-up (a flag the script rejects) end in whatever order the machine finishes
    them; reporting the first to end made the message and its reproduce command change between two gradings."""
    end = time.monotonic() + _SETTLE
    while time.monotonic() < end and any(run.poll() is None for run in runs):
        time.sleep(_POLL)
    for run in runs:
        if _failed(run, rc := run.poll(), ok):
            _early_exit(run, rc, ok, runs)


def watch(runs: list[Run], limit: int | None = None, ok: bool = True, resumed: bool = False,
           on_poll: Callable[[], None] | None = None) -> None:
    """Wait until every run has exited; ``on_poll()`` at each look may append runs to ``runs``.

    A run with ``kill_after`` that logs a later step while still alive is killed here (its script
    steps no ``torch.optim`` optimizer: the fallback). Everything stops when a run exits with an
    error (``ok``; the planned SIGKILL is not one; :func:`_first_failure` says which, and an error
    seen in a look wins over a step past the limit in the same look), logs a step beyond ``limit``,
    or runs past ``CPU_LIMIT`` CPU seconds or ``WALL_FACTOR`` times that in wall time: limits in CPU
    time give the same verdict on a busy machine.
    """
    start = time.monotonic()
    next_clock = start + _CLOCK_EVERY
    try:
        while True:
            if on_poll is not None:
                on_poll()
            codes = [run.poll() for run in runs]
            if any(_failed(run, rc, ok) for run, rc in zip(runs, codes)):
                _first_failure(runs, ok)
            for run, rc in zip(runs, codes):
                if limit is not None and run.max_step() > limit:
                    _too_many_steps(run, limit, resumed)
                # past kill_after: the step hook never fired (a torch script is killed inside step kill_after,
                # so it has logged that step at most)
                if rc is None and run.kill_after is not None and run.max_step() > run.kill_after:
                    run.polled = True
                    run.kill()
            if all(rc is not None for rc in codes):
                return  # every run had exited when its exit was judged above (a fresh poll could skip a crash)
            now = time.monotonic()
            if now >= next_clock:
                next_clock, wall = now + _CLOCK_EVERY, now - start > WALL_FACTOR * CPU_LIMIT
                for run in runs:
                    if run.poll() is None and (wall or run.cpu() > CPU_LIMIT):
                        _over_time(run, wall)
            time.sleep(_POLL)
    except BaseException:
        for run in runs:
            run.kill()
        raise


def run_all(runs: list[Run], limit: int | None = None, ok: bool = True, resumed: bool = False) -> list[int]:
    """Start the runs side by side (they are tiny) and wait for all of them."""
    for run in runs:
        run.start()
    watch(runs, limit, ok=ok, resumed=resumed)
    for run in runs:
        run.kill()  # already exited: closes the log
    return [run.proc.returncode for run in runs]
