"""Behaviour checks for the chapter 0.4 homework: run the learner's scripts, never read their code.

Each check starts the learner's script as a subprocess, exactly as the 约定 (contract) block
at the end of its section in ``10_homework.ipynb`` shows, then reads the files the script
wrote. The contract, in the order the five upgrades introduce it:

1. ``check_config``: flags ``--out DIR --seed N --max-steps N --model {small,tiny}
   --data-fraction F`` (plus the baseline's ``--epochs --batch-size --lr``);
   ``DIR/config.json`` holds the seed (key ``seed``, any depth) and the git commit (a key
   whose name contains ``commit``); ``DIR/metrics.jsonl`` has one JSON object per optimizer
   step with ``step`` (1, 2, ...) and ``loss``; eval records carry ``"split": "val"``.
2. ``check_resume``: ``--resume`` (continue from the newest checkpoint in ``DIR``),
   ``--ckpt-every-steps N`` and ``--dropout P`` (dropout draws its masks from the global
   generator: a checkpoint without the RNG state resumes onto other masks); ``metrics.jsonl``
   written while training (flushed at least at every checkpoint); after ``--resume`` it is
   appended to or recreated, step numbers continue.
3. ``check_clipping``: ``--clip MAX_NORM``; every training record has ``grad_norm`` (the
   PRE-clip global norm) and ``clipped`` (bool); the clip acts (``--clip 1e-4`` and
   ``--clip 1e6`` train differently).
4. ``check_ema``: ``--ema-decay D`` (0 disables); the evaluation at the end of training is a
   ``"split": "val"`` record with ``loss``, ``acc``, ``loss_ema``, ``acc_ema`` (no ``*_ema``
   when disabled); the EMA is in the checkpoint: after a kill and ``--resume`` the final EMA
   evaluation equals the uninterrupted run's.
5. ``check_overfit``: ``debug_overfit.py`` and ``debug_overfit_broken_labels.py`` take
   ``--out --steps --batch-size --model --seed``, write ``DIR/metrics.jsonl`` (``step``,
   ``loss``, ``grad_norm``) and ``DIR/samples.png``, exit 0 when the batch was memorised,
   non-zero otherwise.

``UPGRADES`` lists them in order for the grader (``course_tools.grade``); every check takes a
``launcher`` (how a script is started: ``LOCAL``, or the grader's sandbox) and a ``workdir``
(where the run folders go). Files the scripts write are untrusted: the readers refuse
symlinks and oversized files. Each check prints the absolute path of the script it runs.

Outcomes never depend on luck: the seeds are fixed (``seed=1234``), so a failure reproduces
with the command the failure message prints. When a script stops early, the failure shows
the script's own error (the argparse message, or the exception and the learner's line),
not a consequence of it. Scripts run side by side with one CPU thread each (two threads per
process on a busy 2-core machine are several times slower: ``bench/threads.py``).

Reference machinery (the homework of ``10_homework``). Example::

    from course_tools.checks.nb10_homework import check_config
    check_config("notebooks/homework/train_cifar.py")
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from course_tools import interrupt
from course_tools.checks import CheckFailed, expect, fail, passed
from course_tools.cputime import WALL_FACTOR, cpu_clock
from course_tools.quiet import quiet_environ
from course_utils.data import default_data_root
from course_utils.repro import git_commit

__all__ = ["SEED", "SMALL_RUN", "CPU_LIMIT", "METRICS_CAP", "CONFIG_CAP", "Launcher", "LOCAL", "Upgrade", "UPGRADES",
           "read_records", "read_train_records", "check_config", "check_resume", "check_clipping", "check_ema",
           "check_overfit", "HINTS"]


SEED = 1234
# Tiny runs: the smallest model on 10% of the data; --max-steps ends them, not --epochs.
SMALL_RUN = ["--model", "tiny", "--data-fraction", "0.1", "--batch-size", "32", "--epochs", "1000"]
CPU_LIMIT = 60      # CPU seconds for one run of a script (a check's run takes a few); WALL_FACTOR x this in wall time
METRICS_CAP = 64 * 2**20   # bytes: a metrics.jsonl larger than this is refused unread
CONFIG_CAP = 2**20         # bytes: the same for config.json
_POLL = 0.05        # seconds between looks at the running scripts
_CLOCK_EVERY = 0.5  # seconds between readings of their CPU clocks
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


def _env() -> dict[str, str]:
    # One thread per process: the checks run two or three scripts side by side. The data is always the
    # stand-in (a data root without CIFAR-10), as in the grader: an epoch of the small run is 16 steps everywhere.
    return {**quiet_environ(), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "COURSE_DATA": str(default_data_root() / "checks")}


def _script(path: str | os.PathLike) -> Path:
    p = Path(path).resolve()
    expect(p.is_file(), f"脚本 {p.name} 存在", f"找不到 {p}", "文件名和位置要与本节约定一致")
    return p


# ------------------------------------------------------------------ the script's own error

_ARGPARSE = re.compile(r"^(?:usage: .*|.*: error: (?P<msg>.*))$")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')


def _script_error(text: str, folder: Path) -> tuple[str, list[str]]:
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
def _scratch(workdir: Path | None, name: str) -> Iterator[Path]:
    """The folder of one check's runs: a fresh one under ``workdir`` (kept), or a temporary one."""
    if workdir is None:
        with tempfile.TemporaryDirectory() as tmp:
            yield Path(tmp)
    else:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        yield Path(tempfile.mkdtemp(prefix=f"{name}-", dir=workdir))


def _announce(*scripts: Path) -> None:
    """The first line of every check: the absolute path of each script it runs."""
    print("运行: " + "、".join(str(s) for s in scripts))


_SIGKILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)  # a process killed by SIGKILL; through bwrap, 128 + 9


class _Run:
    """One run of a learner's script: command, log file and run folder (``--out``).

    ``kill_after``: the run is SIGKILLed right after its ``kill_after``-th optimizer step, inside
    its own process (:mod:`course_tools.interrupt`); the check kills it when ``metrics.jsonl``
    shows a later step only if the script steps no ``torch.optim`` optimizer (``polled``).
    """

    def __init__(self, script: Path, args: list[str], workdir: Path, name: str, what: str,
                 launcher: Launcher | None = None, log_name: str | None = None, kill_after: int | None = None) -> None:
        self.script, self.what, self.kill_after = script, what, kill_after
        self.launcher = launcher or LOCAL
        self.advice = ""  # said before the reproduce command when the script stops with an error
        self.out = workdir / name
        self.log = workdir / f"{log_name or name}.log"
        self.args = ["--out", str(self.out), *args]
        self.proc: subprocess.Popen | None = None
        self.polled = False   # killed by the check on seeing a step past kill_after in the log (not by the step hook)
        self.cpu = lambda: 0.0
        self._handle = None

    def start(self) -> _Run:
        self.out.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.log, "w", encoding="utf-8")
        argv = [sys.executable, str(self.script), *self.args]
        if self.kill_after is not None:
            argv[1:1] = [interrupt.__file__, str(self.kill_after)]
        self.proc = self.launcher(argv, cwd=self.script.parent, env=_env(), stdout=self._handle, writable=self.out)
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
            return read_records(self.out / "metrics.jsonl")
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


def _unknown_in_all(failed: _Run, unknown: list[str], siblings: list[_Run]) -> list[str]:
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
            missing.update(_script_error(r.output(), r.script.parent)[1])
    runs = sorted((failed, *others), key=lambda r: -len(r.args))  # the fullest command line sets the order
    order = [a for r in runs for a in r.args if a.startswith("--")]
    return sorted(missing, key=lambda flag: order.index(flag) if flag in order else len(order))


def _early_exit(run: _Run, rc: int, ok: bool = True, siblings: list[_Run] = ()) -> None:
    """Fail with the script's own error: what a learner needs when the script stops early."""
    error, unknown = _script_error(run.output().replace(str(run.out), "runs/hw_check"), run.script.parent)
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


def _too_many_steps(run: _Run, limit: int, resumed: bool = False) -> None:
    hint = (f"--max-steps 是总步数: 续训进程也在 step {limit} 停下" if resumed
            else "训练满 --max-steps 步就结束整个训练: 连 epoch 循环一起跳出")
    fail(f"{run.what} 在 step {limit} 结束(--max-steps {limit})", f"metrics.jsonl 里已经出现 step {run.max_step()}", hint)


def _over_time(run: _Run, wall: bool) -> None:
    if wall:
        fail(f"{run.what} 在 {WALL_FACTOR * CPU_LIMIT} s 内结束", f"超时: {WALL_FACTOR * CPU_LIMIT} s 后仍在运行,"
             f"只用了 {run.cpu():.0f} s CPU 时间: 它在等待(sleep、input() 或卡住的读写)",
             f"检查的运行只有几十步,几秒就能跑完。复现: {run.command()}")
    fail(f"{run.what} 用不到 {CPU_LIMIT} s CPU 时间(检查的运行只有几十步)", f"超时: 已用 {run.cpu():.0f} s CPU 时间,还没结束",
         f"是不是没有在 --max-steps 处停下,或者用了完整的数据和模型?复现: {run.command()}")


def _watch(runs: list[_Run], limit: int | None = None, ok: bool = True, resumed: bool = False,
           on_poll: Callable[[], None] | None = None) -> None:
    """Wait until every run has exited; ``on_poll()`` at each look may append runs to ``runs``.

    A run with ``kill_after`` that logs a later step while still alive is killed here (its script
    steps no ``torch.optim`` optimizer: the fallback). Everything stops at the first run that
    exits with an error (``ok``; the planned SIGKILL is not one), logs a step beyond ``limit``,
    or runs past ``CPU_LIMIT`` CPU seconds or ``WALL_FACTOR`` times that in wall time: limits in
    CPU time give the same verdict on a busy machine.
    """
    start = time.monotonic()
    next_clock = start + _CLOCK_EVERY
    try:
        while True:
            if on_poll is not None:
                on_poll()
            codes = [run.poll() for run in runs]
            for run, rc in zip(runs, codes):
                if rc is not None and not run.killed_as_planned() and (rc != 0 if ok else run.crashed()):
                    _early_exit(run, rc, ok, runs)
                if limit is not None and run.max_step() > limit:
                    _too_many_steps(run, limit, resumed)
                # past kill_after: the step hook never fired (a torch script is killed inside step kill_after,
                # so it has logged that step at most)
                if rc is None and run.kill_after is not None and run.max_step() > run.kill_after:
                    run.polled = True
                    run.kill()
            if all(run.poll() is not None for run in runs):
                return
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


def _run_all(runs: list[_Run], limit: int | None = None, ok: bool = True, resumed: bool = False) -> list[int]:
    """Start the runs side by side (they are tiny) and wait for all of them."""
    for run in runs:
        run.start()
    _watch(runs, limit, ok=ok, resumed=resumed)
    for run in runs:
        run.kill()  # already exited: closes the log
    return [run.proc.returncode for run in runs]


# ------------------------------------------------------------------ reading what the script wrote

def _read_untrusted_bytes(path: Path, cap: int) -> bytes | None:
    """The bytes of a file the learner's script wrote, or None when it does not exist.

    A symlink (the file or its folder) and anything but a regular file are refused, and so is a
    file over ``cap`` bytes: the script is untrusted, its files may point anywhere or fill memory.
    """
    for p in (path.parent, path):
        if p.is_symlink():
            fail(f"{p.name} 是脚本自己写的普通文件", f"{p.name} 是符号链接", "直接写文件,不要链接到别处")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        fail(f"{path.name} 可以读取", f"{type(exc).__name__}: {exc.strerror}", "直接写文件,不要链接到别处")
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        expect(stat.S_ISREG(info.st_mode), f"{path.name} 是普通文件", "它不是", "用 open(..., \"w\") 写出")
        data = f.read(cap + 1)
    expect(len(data) <= cap, f"{path.name} 不超过 {cap // 2**20} MiB", "超过了",
           "检查只跑几十步: 每步一行 JSON,不会有这么大")
    return data


def _read_untrusted(path: Path, cap: int) -> str | None:
    """The text of a file the learner's script wrote (see ``_read_untrusted_bytes``)."""
    data = _read_untrusted_bytes(path, cap)
    return None if data is None else data.decode("utf-8", errors="replace")


def read_records(path: Path) -> list[Any]:
    """Every complete JSON line of a ``metrics.jsonl`` written by the learner ([] when it does not exist).

    A torn or invalid line is skipped (the process may be killed while writing it).
    """
    text = _read_untrusted(Path(path), METRICS_CAP)
    records = []
    for line in (text or "").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def read_train_records(out: Path) -> dict[int, dict[str, Any]]:
    """Training records of ``out/metrics.jsonl`` by step (the last record of a step wins)."""
    path = out / "metrics.jsonl"
    expect(path.exists() or path.is_symlink(), f"--out 目录里有 {path.name}", "没有这个文件",
           '每个优化器步追加一行 JSON,例如 {"step": 1, "loss": 2.3051}(见本节约定)')
    records: dict[int, dict[str, Any]] = {}
    for rec in read_records(path):
        if not isinstance(rec, dict) or rec.get("split", "train") != "train":
            continue
        expect("step" in rec and "loss" in rec, "每条训练记录都有 step 和 loss",
               f"记录 {json.dumps(rec, ensure_ascii=False)[:200]}", '评估记录要带 "split": "val"')
        expect(isinstance(rec["step"], int) and _number(rec["loss"]),
               "step 是整数、loss 是数字", f"step={rec['step']!r}, loss={rec['loss']!r}", "写 loss.item(),不要写张量或字符串")
        records[rec["step"]] = rec
    expect(len(records) > 0, f"{path.name} 里至少有一条训练记录", "一条也没有")
    return records


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _read_config(out: Path) -> Any:
    text = _read_untrusted(out / "config.json", CONFIG_CAP)
    expect(text is not None, "--out 目录里有 config.json", "没有",
           "启动时写出: course_utils.repro.dump_run_config(args.out, vars(args))")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        fail("config.json 是合法 JSON", f"{type(exc).__name__}: {str(exc)[:200]}", "用 json.dump 写,不要手拼字符串")


def _config_values(obj: Any, name: str, substring: bool = False) -> list[Any]:
    """Values of every key (at any depth) equal to ``name`` (or containing it, with ``substring``)."""
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if (name in str(k).lower()) if substring else str(k) == name:
                found.append(v)
            found += _config_values(v, name, substring)
    elif isinstance(obj, list):
        for v in obj:
            found += _config_values(v, name, substring)
    return found


def _losses(records: dict[int, dict[str, Any]]) -> list[float]:
    return [round(records[s]["loss"], 5) for s in sorted(records)]


def _finish(message: str, start: float) -> str:
    message = f"{message}(用时 {time.monotonic() - start:.0f} s)"
    passed(message)
    return message


# ------------------------------------------------------------------ upgrade 1

def check_config(script: str | os.PathLike, seed: int = SEED, *, launcher: Launcher | None = None,
                 workdir: Path | None = None, commit: str | None = None) -> str:
    """Upgrade 1: ``--seed`` makes runs repeatable, and ``config.json`` records seed and commit.

    ``commit``: None, the recorded commit must be ``git rev-parse HEAD`` of the script's folder
    (when it is in a git repository); a hash, it must be that one; ``""`` (no history known), any
    non-empty value of a key naming the commit will do.
    """
    script = _script(script)
    _announce(script)
    start = time.monotonic()
    with _scratch(workdir, "config") as tmp:
        a, b, c = (_Run(script, ["--seed", str(s), "--max-steps", "3", *SMALL_RUN], tmp, name, f"--seed {s} 的运行",
                        launcher) for name, s in (("a", seed), ("b", seed), ("c", seed + 1)))
        _run_all([a, b, c], limit=3)
        config = _read_config(a.out)
        seeds = _config_values(config, "seed")
        expect(seed in seeds, f"config.json 里 seed = {seed}(本次传入的 --seed)", f"找到的 seed: {seeds or '无'}",
               "把全部命令行参数写进去: dump_run_config(args.out, vars(args))")
        commits = [v for v in _config_values(config, "commit", substring=True) if isinstance(v, str) and v.strip()]
        expect(bool(commits), "config.json 里有 git commit(键名含 commit)", "没有",
               "dump_run_config 会写 git_commit;自己写时用 git rev-parse HEAD")
        head = git_commit(script.parent)[0] if commit is None else commit
        if head and head != "unknown":
            expect(head in commits, f"记录的 commit 等于当前 HEAD {head[:10]}", f"{commits}",
                   "commit 要取脚本所在仓库的 HEAD")
        ra, rb, rc = (read_train_records(run.out) for run in (a, b, c))
        steps = sorted(ra)
        expect(steps == [1, 2, 3], "--max-steps 3 恰好训练 3 步,记为 step 1, 2, 3", f"steps {steps}",
               "step 从 1 开始数(第一个优化器步记为 1)" if 0 in steps else "训练满 --max-steps 步就结束")
        same = sorted(rb) == steps and all(
            math.isclose(ra[s]["loss"], rb[s]["loss"], rel_tol=1e-6, abs_tol=1e-7) for s in steps)
        expect(same, f"同一个 --seed {seed} 跑两次,每步 loss 完全相同", f"{_losses(ra)} vs {_losses(rb)}",
               "set_seed(args.seed) 要在建模型、建 DataLoader 之前调用")
        differ = any(abs(ra[s]["loss"] - rc[s]["loss"]) > 1e-6 for s in steps if s in rc)
        expect(differ, f"换成 --seed {seed + 1},loss 随之改变", f"两个 seed 的 loss 都是 {_losses(ra)}",
               "set_seed 用的是 args.seed 吗?种子写死了,--seed 就不起作用")
    return _finish(f"升级 1: --seed {seed} 两次运行逐步一致,换 seed 会变;config.json 记录了 seed 和 commit", start)


# ------------------------------------------------------------------ upgrade 2

RESUME_RUN = ["--dropout", "0.5", *SMALL_RUN]  # dropout: the global generator's state matters on resume


@dataclass
class _Resumed:
    """A run killed at one point, then resumed with ``--resume``."""

    where: str                            # the kill point in words: "epoch 中间" / "epoch 结尾"
    run: _Run                             # the resumed process
    killed_at: int                        # the last step the killed process logged
    first: int                            # the resumed process's first step
    after: dict[int, dict[str, Any]]      # its training records
    polled: bool = False                  # the kill came from watching the log (no torch.optim step to count)


@dataclass
class _Interrupted:
    """An uninterrupted run, and the same command killed mid-epoch and at an epoch end, each resumed."""

    ref: _Run
    reference: dict[int, dict[str, Any]]  # the uninterrupted run's training records
    resumes: list[_Resumed]               # mid-epoch, then epoch end


EPOCH_END_HINT = ("每个 epoch 结束时评估一次,写一条 \"split\": \"val\" 记录(约定 2):检查用第一条找到 epoch 的结尾,"
                  "在那之后再 kill 一次")


def _epoch_end(ref: _Run, total_steps: int) -> int | None:
    """The step of the reference's first evaluation record before its last step: the end of its first epoch."""
    steps = [r["step"] for r in ref.records() if isinstance(r, dict) and r.get("split") == "val"
             and isinstance(r.get("step"), int) and 0 < r["step"] < total_steps]
    return min(steps, default=None)


def _with_flag(args: list[str], flag: str, value: str) -> list[str]:
    i = args.index(flag)
    return [*args[:i + 1], value, *args[i + 2:]]


def _killed(run: _Run, total_steps: int) -> int:
    """The last step ``run`` logged before its planned SIGKILL; fails when it was not killed mid-training."""
    written = run.max_step()
    if not run.killed_as_planned():
        expect(written > run.kill_after, f"{run.what}一直训练到 step {total_steps}",
               f"进程正常退出,metrics.jsonl 只记到 step {written}", "--max-steps 到了才结束;检查会同时传 --epochs 1000")
    finished_first = not run.killed_as_planned() or (run.polled and written >= total_steps)
    if finished_first:  # only a script the step hook cannot count gets here
        fail(f"{run.what}在第 {run.kill_after} 个优化器步之后被 SIGKILL(训练还没结束)",
             f"检查来得及 kill 它之前,进程已经跑完了 {total_steps} 步",
             f"脚本没有调用 torch.optim 优化器的 step():检查平时在进程里数优化器步、到第 {run.kill_after} 步就 kill,"
             f"这里只能等 metrics.jsonl 出现 step {run.kill_after + 1} 再 kill,这次没赶上(机器很忙时会这样)。"
             "稍后在空闲时重试;用 torch.optim 的优化器就没有这个问题")
    expect(bool(run.records()), f"{run.what}被 SIGKILL 时,metrics.jsonl 里已有之前各步的记录",
           f"它在 step {run.kill_after} 之后被 kill,metrics.jsonl 里一条训练记录也没有",
           "metrics.jsonl 要边训练边写: 至少每次存检查点前 flush() 一次")
    return written


def _interrupted(script: Path, common: list[str], tmp: Path, launcher: Launcher | None, total_steps: int,
                 kill_after: int, extra: list[_Run] = ()) -> _Interrupted:
    """Run ``common`` to the end (the reference) and twice more, each SIGKILLed at an exact step and resumed.

    Kill points: after step ``kill_after`` (mid-epoch, checkpoints as ``common`` says) and after
    the first step of the second epoch, with a checkpoint at every epoch end (``--ckpt-every-steps``
    = the epoch's length, read from the reference's first evaluation record). Whatever the
    script does between a save and the next step (an evaluation whose ``DataLoader`` draws from
    the global generator) then shows. The epoch-end run starts as soon as the reference has
    logged that record; ``extra`` runs beside them. Each killed run's ``metrics.jsonl`` is moved
    out of its folder, then both resume side by side. Fails on a run that cannot be killed mid-training.
    """
    ref = _Run(script, common, tmp, "ref", "不中断的参照运行", launcher)
    mid = _Run(script, common, tmp, "mid", "在 epoch 中间被中断的运行", launcher, kill_after=kill_after)
    runs = [ref, mid, *extra]
    cut: list[_Run] = []

    def start_epoch_end() -> None:
        end = None if cut else _epoch_end(ref, total_steps)
        if end is not None:
            cut.append(_Run(script, _with_flag(common, "--ckpt-every-steps", str(end)), tmp, "end",
                            f"在 epoch 结尾(step {end})之后被中断的运行", launcher, kill_after=end + 1).start())
            runs.append(cut[0])

    for r in runs:
        r.start()
    try:
        _watch(runs, limit=total_steps, on_poll=start_epoch_end)
    finally:
        for r in runs:
            r.kill()
    reference = read_train_records(ref.out)
    expect(bool(cut), f"{ref.what}在每个 epoch 结束时写一条评估记录", f"{total_steps} 步里没有一条 step < {total_steps} 的"
           " \"split\": \"val\" 记录", EPOCH_END_HINT)
    end = cut[0]
    killed = [(mid, "epoch 中间", _killed(mid, total_steps)), (end, "epoch 结尾", _killed(end, total_steps))]
    resumed, befores = [], []
    for run, _, _ in killed:
        befores.append(run.train_steps())
        os.replace(run.out / "metrics.jsonl", tmp / f"{run.out.name}.before_kill.jsonl")  # out of the resumed one's reach
        again = _Run(script, [*run.args[2:], "--resume"], tmp, run.out.name, "--resume 续训", launcher,
                     log_name=f"{run.out.name}.resume")
        again.advice = ("错在加载检查点时,可能是读到了只写了一半的文件: 检查点要原子写入"
                        "(先写临时文件再 os.replace),CheckpointManager 已经这样做了。")
        resumed.append(again)
    _run_all(resumed, limit=total_steps, resumed=True)
    epoch_end = end.kill_after - 1
    resumes = [_verify(again, where, killed_at, before, reference, total_steps, epoch_end, run.polled)
               for (run, where, killed_at), again, before in zip(killed, resumed, befores)]
    return _Interrupted(ref, reference, resumes)


def _verify(resumed: _Run, where: str, killed_at: int, before: dict[int, dict[str, Any]],
            reference: dict[int, dict[str, Any]], total_steps: int, epoch_end: int, polled: bool) -> _Resumed:
    """The resumed run continues the killed one's log (``before``: its training records) and the reference's
    losses, step by step."""
    expect((resumed.out / "metrics.jsonl").exists(), "续训进程也写 metrics.jsonl", "续训后没有这个文件",
           "--resume 时追加或重新创建 metrics.jsonl 都可以")
    after = read_train_records(resumed.out)
    first = min(after)
    expect(first > 1, "--resume 从检查点接着训练(续训进程的第一步 > 1)", "续训进程从 step 1 重新开始",
           "--resume 时加载 --out 里最新的检查点,并从它保存的 step 接着数")
    expect(first <= killed_at + 1, f"续训从 kill 之前存下的检查点开始(≤ step {killed_at + 1})",
           f"从 step {first} 开始,可被中断的运行只记到了 step {killed_at}", "step 编号要接着检查点里保存的 step")
    expect(sorted(after) == list(range(first, total_steps + 1)),
           f"续训进程记录 step {first}..{total_steps},不缺不重", f"steps {sorted(after)[:3]}…{sorted(after)[-3:]}",
           "续训后每个优化器步记一行,到 --max-steps 为止")
    missing = [s for s in range(1, first) if s not in before]
    expect(not missing, f"kill 之前 metrics.jsonl 已有 step 1..{first - 1}", f"缺少 {missing[:5]}",
           "每次存检查点之前先 flush() metrics.jsonl:检查点覆盖到的步,记录必须已经在磁盘上")
    mismatched = [s for s in sorted(after) if s not in reference or not _close(after[s]["loss"], reference[s]["loss"])]
    if mismatched:
        s = mismatched[0]
        if where == "epoch 结尾":
            hint = (f"从 epoch 中间续训是一致的,从 epoch 结尾(step {epoch_end})的检查点续训却对不上:存下这份检查点之后、"
                    "下一步训练之前,脚本又从 torch 的全局随机数生成器取过数,检查点里的随机数状态已经不是训练接着用的"
                    "那个(dropout 的掩码随之改变)。最常见的是评估: 普通的 DataLoader 每次 iter() 都从全局生成器取一个种子,"
                    "shuffle=False 也一样。评估用 make_loader(test_set, 512, shuffle=False)(它有自己的 generator),"
                    "或者评估完再存检查点")
        elif s == first:
            hint = ("续训后的第一步就不同: 这一步的 batch、模型权重或 dropout 的随机掩码和原来的不一样。"
                    "数据顺序要只取决于 (seed, epoch),并从 epoch 中间接着取: "
                    "make_loader(ds, bs, seed=seed, epoch=epoch, start_batch=k);dropout 的掩码取自 torch 的全局"
                    "随机数生成器,它的随机数状态也要存进检查点并恢复")
        else:
            hint = (f"续训后第一步一致,从 step {s} 起偏离: 权重对了,但优化器状态(AdamW 的动量)、学习率调度"
                    "或随机数状态没有完整恢复")
        ref_loss = f"{reference[s]['loss']:.5f}" if s in reference else "没有这一步"
        fail(f"在 {where}被 kill、续训后的 loss 与不中断的运行逐步一致(曲线无缝衔接)",
             f"step {s}: 续训 {after[s]['loss']:.5f} vs 不中断 {ref_loss}", hint)
    return _Resumed(where, resumed, killed_at, first, after, polled)


POLLED_NOTE = ("。注意: 脚本没有调用 torch.optim 优化器的 step(),检查只能在 metrics.jsonl 出现那一步时 kill 它,"
               "kill 的时机取决于机器忙不忙")


def _polled_note(got: _Interrupted) -> str:
    return POLLED_NOTE if any(r.polled for r in got.resumes) else ""


def _close(a: float, b: float, rel: float = 1e-3) -> bool:
    return abs(a - b) <= rel * max(1.0, abs(b))


def check_resume(script: str | os.PathLike, seed: int = SEED, total_steps: int = 60, kill_after: int = 25,
                 every: int = 10, *, launcher: Launcher | None = None, workdir: Path | None = None) -> str:
    """Upgrade 2: SIGKILL, ``--resume``: the loss curve equals the uninterrupted run's, from two kill points.

    The same command (same seed, and dropout, so the global RNG state matters) runs to the
    end as the reference, and is SIGKILLed twice more right after an exact optimizer step (no
    chance to save; :mod:`course_tools.interrupt`): after step ``kill_after`` (mid-epoch) and
    after the first step that follows the first epoch end, with a checkpoint at that epoch end.
    Each killed run's ``metrics.jsonl`` is moved aside and it resumes: the resumed process must
    start after step 1 and its losses must match the reference at the same steps.
    """
    script = _script(script)
    _announce(script)
    start = time.monotonic()
    with _scratch(workdir, "resume") as tmp:
        common = ["--seed", str(seed), "--max-steps", str(total_steps), "--ckpt-every-steps", str(every), *RESUME_RUN]
        got = _interrupted(script, common, tmp, launcher, total_steps, kill_after)
        worst = max(abs(r.after[s]["loss"] - got.reference[s]["loss"]) for r in got.resumes for s in r.after)
    mid, end = got.resumes
    return _finish(f"升级 2: 两次 SIGKILL 后,从 step {mid.first - 1}(epoch 中间)和 step {end.first - 1}(epoch 结尾,"
                   f"评估之后)的检查点各续训一次,之后每一步的 loss 都与不中断的运行一致(最大差 {worst:.1e}){_polled_note(got)}",
                   start)


# ------------------------------------------------------------------ upgrade 3

def check_clipping(script: str | os.PathLike, seed: int = SEED, steps: int = 6, *, launcher: Launcher | None = None,
                   workdir: Path | None = None) -> str:
    """Upgrade 3: the pre-clip grad norm is logged each step, ``clipped`` says when clipping fired,
    and the clip acts: ``--clip 1e-4`` and ``--clip 1e6`` give different losses after step 1."""
    script = _script(script)
    _announce(script)
    start = time.monotonic()
    tight_clip = 1e-4
    with _scratch(workdir, "clipping") as tmp:
        runs = [_Run(script, ["--seed", str(seed), "--clip", clip, "--max-steps", str(steps), *SMALL_RUN], tmp, name,
                     f"--clip {clip} 的运行", launcher) for name, clip in (("tight", "1e-4"), ("loose", "1e6"))]
        _run_all(runs, limit=steps)
        tight, loose = (read_train_records(run.out) for run in runs)
        for recs in (tight, loose):
            for step, rec in recs.items():
                expect("grad_norm" in rec and "clipped" in rec, "每条训练记录都有 grad_norm 和 clipped",
                       f"step {step} 的记录只有 {sorted(rec)}", "两项都写进每一步的那一行 JSON")
                g = rec["grad_norm"]
                expect(_number(g) and g > 0, "grad_norm 是有限正数", f"step {step}: {g!r}",
                       "记录 clip_grad_norm_ 的返回值(.item())")
        norms = [tight[s]["grad_norm"] for s in sorted(tight)]
        expect(max(norms) > tight_clip * (1 + 1e-3), "grad_norm 是裁剪前的范数(在 --clip 1e-4 时也远大于 1e-4)",
               f"--clip 1e-4 时每步记录的 grad_norm 都不超过 1e-4: {[f'{g:.3g}' for g in norms]}",
               "你记录的是裁剪后的范数。clip_grad_norm_ 的返回值就是裁剪前的范数,直接记录它,不要裁剪后再算一遍")
        g_tight, g_loose = tight[min(tight)]["grad_norm"], loose[min(loose)]["grad_norm"]
        expect(math.isclose(g_tight, g_loose, rel_tol=1e-3), "第 1 步两次运行的 grad_norm 相同(它与 --clip 无关)",
               f"--clip 1e-4: {g_tight:.4g};--clip 1e6: {g_loose:.4g}",
               "第 1 步的权重和数据两次完全相同;记录的应是 backward 之后、裁剪之前的全局范数")
        flags_tight = [bool(tight[s]["clipped"]) for s in sorted(tight)]
        flags_loose = [bool(loose[s]["clipped"]) for s in sorted(loose)]
        reversed_ = not any(flags_tight) and all(flags_loose)
        expect(all(flags_tight), "--clip 1e-4 时每一步 clipped 都为 true", f"{flags_tight}",
               "clipped 写反了: 应为 grad_norm > max_norm" if reversed_ else
               "clipped 就是“裁剪前的范数 > 阈值”")
        expect(not any(flags_loose), "--clip 1e6 时没有一步被裁剪(clipped 全为 false)", f"{flags_loose}",
               "clipped 就是“裁剪前的范数 > 阈值”,不是“调用过 clip_grad_norm_”")
        later = [s for s in sorted(tight) if s > 1 and s in loose]
        gap = max((abs(tight[s]["loss"] - loose[s]["loss"]) / max(1.0, abs(loose[s]["loss"])) for s in later),
                  default=0.0)
        expect(gap > 1e-6, "裁剪真的起作用: --clip 1e-4 与 --clip 1e6 从第 2 步起 loss 不同",
               f"两次运行每一步的 loss 都相同: {_losses(tight)}",
               "梯度根本没被裁剪: clip_grad_norm_(model.parameters(), args.clip) 要在 backward() 之后、"
               "optimizer.step() 之前调用,阈值用 args.clip(不是 inf)")
    return _finish(f"升级 3: 每步记录裁剪前的 grad norm(第 1 步 {g_loose:.3f}),clipped 在阈值 1e-4 时全为 true、"
                   f"1e6 时全为 false,两次的 loss 随之不同(最大相对差 {gap:.1e})", start)


# ------------------------------------------------------------------ upgrade 4

EMA_DECAY = "0.9"     # the EMA of the resume runs: far enough from the raw weights to tell them apart
NEAR_ZERO = "1e-6"    # a decay this small makes the EMA the raw weights of the same step
# relative: a resumed CPU run is bit-identical, and so is evaluating the same weights twice
RESUMED_EMA_TOLERANCE = 1e-6
SAME_WEIGHTS = 1e-7


def _final_eval(run: _Run, step: int, ema: bool) -> dict[str, Any]:
    """The last ``"split": "val"`` record at ``step``, with its numbers checked."""
    found = [r for r in run.records() if isinstance(r, dict) and r.get("split") == "val" and r.get("step") == step]
    expect(bool(found), f"{run.what} 在训练结束时(step {step})写一条评估记录",
           f'metrics.jsonl 里没有 "split": "val"、"step": {step} 的记录',
           "训练结束时(到 --max-steps 为止)评估一次,把结果作为一行 JSON 写进 metrics.jsonl")
    rec = found[-1]
    keys = ["loss", "acc", "loss_ema", "acc_ema"] if ema else ["loss", "acc"]
    bad = [k for k in keys if not _number(rec.get(k))]
    expect(not bad, f"{run.what} 的评估记录有 {'、'.join(keys)}(数字)",
           f"记录 {json.dumps(rec, ensure_ascii=False)[:200]}",
           "原始权重和 EMA 权重各评估一次,写进同一行: loss/acc 和 loss_ema/acc_ema")
    if not ema:
        extra = [k for k in ("loss_ema", "acc_ema") if k in rec]
        expect(not extra, "--ema-decay 0 关掉 EMA: 评估记录里没有 loss_ema、acc_ema", f"记录里有 {extra}",
               "decay 为 0 时不建 EMA,也不评估它")
    return rec


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(1e-12, abs(b))


def check_ema(script: str | os.PathLike, seed: int = SEED, total_steps: int = 30, kill_after: int = 15,
              every: int = 10, *, launcher: Launcher | None = None, workdir: Path | None = None) -> str:
    """Upgrade 4: EMA of the weights, evaluated next to the raw ones, kept in the checkpoint.

    Four runs side by side, a fifth from the first epoch end (then two resumes), each ending with an evaluation record:
    ``--ema-decay 0`` has no EMA fields; with ``--ema-decay 1e-6`` the EMA is the raw weights
    of the same step (an EMA updated before ``optimizer.step()`` lags one step behind, one
    with ``decay`` and ``1 - decay`` swapped stays near its start); with ``--ema-decay 0.9``
    the EMA evaluates differently from the raw weights (not the raw model twice), and after a
    SIGKILL and ``--resume``, mid-epoch and at an epoch end as in ``check_resume``, exactly as in the
    uninterrupted run (the EMA is in the checkpoint).
    """
    script = _script(script)
    _announce(script)
    start = time.monotonic()
    with _scratch(workdir, "ema") as tmp:
        def short(name: str, decay: str, steps: int) -> _Run:
            return _Run(script, ["--seed", str(seed), "--max-steps", str(steps), "--ema-decay", decay, *RESUME_RUN],
                        tmp, name, f"--ema-decay {decay} 的运行", launcher)

        off, near = short("off", "0", 3), short("near", NEAR_ZERO, 10)
        common = ["--seed", str(seed), "--max-steps", str(total_steps), "--ckpt-every-steps", str(every),
                  "--ema-decay", EMA_DECAY, *RESUME_RUN]
        got = _interrupted(script, common, tmp, launcher, total_steps, kill_after, extra=[off, near])
        _final_eval(off, 3, ema=False)
        ref = _final_eval(got.ref, total_steps, ema=True)
        expect(_rel(ref["loss_ema"], ref["loss"]) > SAME_WEIGHTS,
               f"--ema-decay {EMA_DECAY} 时 EMA 权重的评估与原始权重不同", f"loss_ema = loss = {ref['loss']:.7f}",
               "acc_ema/loss_ema 评估的还是原始模型: 要评估 EMA 的那份权重(ema.module,或 ema.swapped_into(model))")
        close = _final_eval(near, 10, ema=True)
        expect(_rel(close["loss_ema"], close["loss"]) <= 1e-5,
               f"--ema-decay {NEAR_ZERO} 时 EMA 就是同一步的原始权重(loss_ema ≈ loss)",
               f"loss_ema {close['loss_ema']:.6f} vs loss {close['loss']:.6f}",
               "每次 optimizer.step() 之后更新 EMA(在它之前更新,EMA 就落后一步);"
               "公式是 ema = decay * ema + (1 - decay) * w(decay 和 1 - decay 不要写反)")
        for r in got.resumes:
            resumed = _final_eval(r.run, total_steps, ema=True)
            for key in ("loss_ema", "acc_ema"):
                expect(_rel(resumed[key], ref[key]) <= RESUMED_EMA_TOLERANCE,
                       f"在 {r.where}被 kill、--resume 之后,最后的 {key} 与不中断的运行相同",
                       f"续训 {resumed[key]:.7f} vs 不中断 {ref[key]:.7f}(原始权重的 loss: {resumed['loss']:.7f} vs "
                       f"{ref['loss']:.7f})",
                       "EMA 的状态要存进检查点并在 --resume 时恢复(EMA.state_dict() 含权重和更新次数;"
                       "training_state(..., ema=ema) / restore_training_state(..., ema=ema))")
    mid, end = got.resumes
    return _finish(f"升级 4: EMA 与原始权重并排评估(loss {ref['loss']:.4f}, loss_ema {ref['loss_ema']:.4f}),"
                   f"decay 趋近 0 时两者一致;从 step {mid.first - 1}(epoch 中间)和 step {end.first - 1}(epoch 结尾)"
                   f"的检查点续训,最后的 EMA 评估都与不中断的运行相同{_polled_note(got)}", start)


# ------------------------------------------------------------------ upgrade 5

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_overfit(healthy: str | os.PathLike, broken: str | os.PathLike, seed: int = SEED, steps: int = 150, *,
                  launcher: Launcher | None = None, workdir: Path | None = None) -> str:
    """Upgrade 5: ``debug_overfit.py`` memorises one batch (exit 0) and saves ``samples.png``;
    the label-broken twin cannot memorise (exit != 0)."""
    healthy, broken = _script(healthy), _script(broken)
    _announce(healthy, broken)
    start = time.monotonic()
    with _scratch(workdir, "overfit") as tmp:
        args = ["--steps", str(steps), "--batch-size", "32", "--model", "tiny", "--seed", str(seed)]
        ok_run = _Run(healthy, args, tmp, "ok", healthy.name, launcher)
        bad_run = _Run(broken, args, tmp, "bad", broken.name, launcher)
        rc_ok, rc_bad = _run_all([ok_run, bad_run], limit=steps, ok=False)
        ok, bad = read_train_records(ok_run.out), read_train_records(bad_run.out)
        expect(sorted(ok) == list(range(1, steps + 1)) and sorted(bad) == list(range(1, steps + 1)),
               f"两个脚本各记录 step 1..{steps}(--steps {steps})", f"{len(ok)} 步和 {len(bad)} 步",
               "每个优化器步写一行,step 从 1 开始")
        expect(all("grad_norm" in r for r in ok.values()), f"{healthy.name} 每步也记录 grad_norm",
               f"记录只有 {sorted(ok[min(ok)])}", "loss.backward() 之后算全局梯度范数")
        first_ok, last_ok = ok[1]["loss"], ok[steps]["loss"]
        expect(first_ok > 1.0, "健康脚本从接近 ln(10) ≈ 2.3 的初始 loss 开始", f"{first_ok:.4f}",
               "第一步之前不要先训练;记录的是这一步更新之前算出的 loss")
        expect(last_ok < 0.05, f"健康脚本 {steps} 步后 loss ≈ 0(< 0.05)", f"{last_ok:.4f}",
               "没背下来: 每一步用的是同一个 batch 吗(取一次,不加数据增强)?学习率是否太小?")
        expect(rc_ok == 0, f"{healthy.name} 背下 batch 时退出码为 0", f"退出码 {rc_ok}", "通过时 sys.exit(0)")
        png = _read_untrusted_bytes(ok_run.out / "samples.png", METRICS_CAP)
        expect(png is not None and png.startswith(PNG_MAGIC), f"{healthy.name} 在 --out 里存了 samples.png(PNG 图)",
               "没有这个文件" if png is None else "文件不是 PNG",
               "course_utils.debug.show_samples(x[:8], y[:8], classes) 画出这个 batch,再 fig.savefig(out / \"samples.png\")")
        last_bad = sum(bad[s]["loss"] for s in range(steps - 4, steps + 1)) / 5
        expect(last_bad > 0.5, "注入标签错误的对照脚本 loss 降不下去(最后 5 步平均 > 0.5)", f"{last_bad:.4f}",
               "它把错误的标签也背下来了: 固定的错误映射(每一步都一样)照样能被记住。"
               "要让标签和图像每一步都失去一致的对应,例如每一步重新打乱标签")
        expect(rc_bad != 0, f"{broken.name} 以非 0 退出码报告失败", f"退出码 {rc_bad}",
               "没背下来时打印一条说明,然后 sys.exit(1)")
        expect(bool(bad_run.output().strip()), f"{broken.name} 打印一条说明失败的消息", "没有任何输出",
               "告诉用户过拟合失败了、该按什么顺序排查")
    return _finish(f"升级 5: 健康脚本 loss {first_ok:.2f} → {last_ok:.4f}(退出码 0,存了 samples.png);注入标签错误的"
                   f"对照脚本最后 5 步平均 {last_bad:.2f}(退出码 {rc_bad})", start)


# ------------------------------------------------------------------ the upgrades, for the grader

@dataclass(frozen=True)
class Upgrade:
    """One upgrade of the homework: its check, the scripts (in the homework folder) it runs, and the
    reference answer's commit for it (``patch``, relative to ``solutions/homework``)."""

    number: int
    title: str
    scripts: tuple[str, ...]
    check: Callable[..., str]
    patch: str

    def run(self, folder: Path, **kw: Any) -> str:
        """Run the check on the scripts in ``folder``; the passed message, or :class:`CheckFailed`.

        ``kw``: ``launcher``, ``workdir``, ``seed``; ``commit`` reaches only the check that reads it.
        """
        if self.check is not check_config:
            kw.pop("commit", None)
        return self.check(*(Path(folder) / name for name in self.scripts), **kw)


TRAIN, HEALTHY, TWIN = "train_cifar.py", "debug_overfit.py", "debug_overfit_broken_labels.py"
UPGRADES: tuple[Upgrade, ...] = (
    Upgrade(1, "种子 + config.json", (TRAIN,), check_config, "upgrades/1_seed_config.patch"),
    Upgrade(2, "完整检查点 + kill 后续训", (TRAIN,), check_resume, "upgrades/2_checkpoint_resume.patch"),
    Upgrade(3, "梯度裁剪 + grad norm 日志", (TRAIN,), check_clipping, "upgrades/3_clipping.patch"),
    Upgrade(4, "EMA 权重 + 并排评估", (TRAIN,), check_ema, "upgrades/4_ema.patch"),
    Upgrade(5, "单 batch 过拟合 + 对照脚本", (HEALTHY, TWIN), check_overfit, "upgrades/5_debug_overfit.patch"),
)


# ------------------------------------------------------------------ hints in tiers (course_tools.checks.hint)

_TIERS: dict[str, tuple[str, ...]] = {
    "check_config": (
        "可复现的前提是: 同一个种子两次运行逐步一致,换种子结果就变;而且每次运行都留下足够的记录(全部参数和代码版本),"
        "事后能说清这条曲线是怎么来的",
        "10 的「升级 1:set_seed + 配置写成 JSON(commit 1)」一节和它的约定 1 列出了检查传的参数和要读的文件",
        "常错的几处:种子设在建模型或建 DataLoader 之后;种子写死,没用 --seed;config.json 里只有部分参数或缺 commit;"
        "step 从 0 开始数,或者 --max-steps 到了没有跳出 epoch 循环",
    ),
    "check_resume": (
        "续训后的曲线要和不中断的运行无缝衔接:检查点必须带上下一步要用到的全部状态,数据也要从中断的位置接着取",
        "10 的「升级 2:完整检查点 + kill 后续训(commit 2)」一节,以及 04 的「3. 杀进程自测:kill -9 之后能无缝衔接吗?」",
        "常错的几处:没存或没恢复随机数状态(--dropout 让它立刻暴露);数据从 epoch 开头重新取;metrics.jsonl 没有在存检查点前 flush;"
        "续训时 step 从 1 重新数;检查点不是原子写入",
    ),
    "check_clipping": (
        "要记录的是裁剪之前的全局梯度范数,它才是报警信号;裁剪本身必须真的改变更新,阈值很小时训练曲线应当不同",
        "10 的「升级 3:梯度裁剪 + grad norm 日志(commit 3)」一节,以及 02 讲全局范数裁剪的各节",
        "常错的几处:记录了裁剪之后再算的范数;clipped 写成“调用过裁剪”而不是“范数超过阈值”;"
        "把阈值传错(例如传了无穷大)导致从没裁剪;裁剪放在优化器更新之后",
    ),
    "check_ema": (
        "EMA 是另一份权重: 每次优化器更新之后向当前权重靠近一点,评估时和原始权重并排报告;它也是训练状态,续训要接得上",
        "10 的「升级 4:权重的 EMA,与原始权重并排评估(commit 4)」一节,以及 03 讲手写 EMA 的部分",
        "常错的几处:decay 和 1-decay 写反;在优化器更新之前就更新 EMA;EMA 没存进检查点或续训时没恢复;"
        "评估 EMA 时其实又评估了一遍原始模型;--ema-decay 0 时仍然输出 EMA 字段",
    ),
    "check_overfit": (
        "单 batch 过拟合是最便宜的排错: 健康的训练代码应当能把一个固定的 batch 背下来;对照脚本注入标签错误,"
        "必须背不下来,才证明这个测试能抓到这类 bug",
        "10 的「升级 5:debug_overfit.py 和注入标签错误的对照脚本(commit 5)」一节,以及 07 的单 batch 过拟合",
        "常错的几处:每一步取了新的 batch 或加了数据增强;对照脚本用固定的错误映射(照样能背下来);"
        "失败时没有以非 0 退出码结束;没存 samples.png",
    ),
}


def _naming_its_commit(upgrade: Upgrade, tiers: tuple[str, ...]) -> tuple[str, ...]:
    """The last tier also names the reference answer's commit for the upgrade (the patch of just that section)."""
    return (*tiers[:-1], f"{tiers[-1]}。还找不到,就对照参考答案这一次升级的 commit: solutions/homework/{upgrade.patch}"
                         "(只含这一节的改动,先自己试过再看)")


HINTS: dict[str, tuple[str, ...]] = {u.check.__name__: _naming_its_commit(u, _TIERS[u.check.__name__]) for u in UPGRADES}
