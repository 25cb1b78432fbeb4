"""Run a notebook's code cells in one sandboxed kernel; the grader, not the kernel, decides what each cell did.

Outcomes come from the execute reply and IOPub ``error`` messages, never from files the kernel could write.
Limits count CPU seconds of the whole sandbox (``KernelBox.cpu_seconds``), so a busy machine fails no honest
cell; a wall-clock backstop of ``WALL_FACTOR`` x the limit stops code that sleeps. A cell ends ``ok``/``error``,
or the run stops: ``timeout``/``wall`` (interrupted), ``unresponsive`` (still running ``grace`` s later: killed),
``dead``, ``deadline``/``deadline_wall`` (:class:`Budget`) or ``abuse``. Why not nbval or nbclient: nbval's TCP kernels
are unreachable in a network namespace and it waits a whole timeout on a dead kernel; nbclient keeps waiting on
a kernel that ignores the interrupt. :func:`step` reruns with the offending exercise stubbed, once per exercise.

Example::

    result = asyncio.run(run_cells([(3, "x = 1"), (5, "assert x == 2")], box, cell_timeout=60, budget=Budget(600)))
    result.cells[5].status   # "error"
"""
from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio

from course_tools.cputime import WALL_FACTOR
from course_grader.sandbox import GiB, KernelBox

if TYPE_CHECKING:
    from course_grader.pipeline import Options
    from course_grader.plan import Plan
    from course_grader.steps import Submission

__all__ = ["FINISHED", "DEADLINES", "Budget", "CellResult", "RunResult", "clean_text", "run_cells", "step"]

FINISHED = ("ok", "error")
DEADLINES = ("deadline", "deadline_wall")  # the notebook's total ran out: no rerun
_MAX_MESSAGE = 64 * 2 ** 20  # bytes; a larger message from the kernel closes the connection
_POLL = 0.25                 # seconds between liveness checks and CPU clock readings
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


def clean_text(text: object, limit: int = 400) -> str:
    """``text`` on one line: ANSI escapes and control characters removed, at most ``limit`` characters."""
    text = _CONTROL.sub("", _ANSI.sub("", str(text)).replace("\r", " ").replace("\n", " ").replace("\t", " "))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Budget:
    """The notebook's total limit, shared by all its runs: ``cpu`` CPU seconds of its kernels (their start
    included), and ``WALL_FACTOR`` times that in wall time from ``start``."""

    cpu: float
    start: float = field(default_factory=time.monotonic)
    spent: float = 0.0  # CPU seconds of the kernels that have ended

    @property
    def wall_end(self) -> float:
        """The ``time.monotonic()`` value of the wall-clock backstop."""
        return self.start + WALL_FACTOR * self.cpu

    def over(self, running: float, now: float) -> str:
        """``deadline`` / ``deadline_wall`` when the total has run out, given the running kernel's CPU seconds."""
        if self.spent + running >= self.cpu:
            return "deadline"
        return "deadline_wall" if now >= self.wall_end else ""


@dataclass
class CellResult:
    """What happened to one code cell (``index`` = its position in the notebook)."""

    index: int
    status: str
    ename: str = ""
    evalue: str = ""
    seconds: float = 0.0

    @property
    def message(self) -> str:
        """The error for reports: a check's own message (``期望 …;实际 …``), else ``ename: evalue``."""
        if self.evalue and self.ename in ("CheckFailed", "AssertionError"):
            return clean_text(self.evalue)
        return clean_text(f"{self.ename}: {self.evalue}" if self.evalue else self.ename)


@dataclass
class RunResult:
    """The cells that ran, in order, and the cell that ended the run early (if any)."""

    cells: dict[int, CellResult] = field(default_factory=dict)
    stop: CellResult | None = None
    startup_error: str = ""


class _Cell:
    def __init__(self, msg_id: str) -> None:
        self.msg_id, self.reply, self.idle = msg_id, None, False
        self.ename = self.evalue = ""

    def on_iopub(self, msg: dict) -> None:
        if msg.get("parent_header", {}).get("msg_id") != self.msg_id:
            return
        kind, content = msg.get("msg_type"), msg.get("content") or {}
        if kind == "error" and not self.ename:
            self.ename, self.evalue = clean_text(content.get("ename", ""), 80), clean_text(content.get("evalue", ""))
        elif kind == "status" and content.get("execution_state") == "idle":
            self.idle = True

    def on_shell(self, msg: dict) -> None:
        if msg.get("parent_header", {}).get("msg_id") == self.msg_id and msg.get("msg_type") == "execute_reply":
            self.reply = msg.get("content") or {}
            if self.reply.get("status") == "error" and not self.ename:
                self.ename = clean_text(self.reply.get("ename", ""), 80)
                self.evalue = clean_text(self.reply.get("evalue", ""))

    @property
    def done(self) -> bool:
        return self.reply is not None and self.idle


async def _drain(channel, handle, budget: int = 500) -> None:
    for _ in range(budget):
        if not await channel.msg_ready():
            return
        handle(await channel.get_msg(timeout=0))


async def _execute(km, kc, box: KernelBox, index: int, source: str, cell_timeout: float, budget: Budget,
                   grace: float) -> CellResult:
    start = time.monotonic()
    cpu_start = box.cpu_seconds()
    cell = _Cell(kc.execute(source, store_history=False, allow_stdin=False, stop_on_error=False))
    poller = zmq.asyncio.Poller()
    poller.register(kc.iopub_channel.socket, zmq.POLLIN)
    poller.register(kc.shell_channel.socket, zmq.POLLIN)
    wall_end = start + WALL_FACTOR * cell_timeout
    reason, interrupted, next_look = "", None, start
    while not cell.done:
        now = time.monotonic()
        if interrupted is None and now >= next_look:  # the clock costs a read: once per _POLL
            next_look = now + _POLL
            used = box.cpu_seconds()   # the limit passed, if any: the notebook's before the cell's, CPU before wall
            reason = budget.over(used, now) or ("timeout" if used - cpu_start >= cell_timeout else
                                                "wall" if now >= wall_end else "")
            if reason:  # ask the kernel to stop the cell; give it `grace` seconds
                interrupted = now
                await km.interrupt_kernel()
                continue
        if interrupted is not None and now >= interrupted + grace:
            return CellResult(index, "unresponsive", seconds=now - start)
        if not await km.is_alive():
            return CellResult(index, "dead", cell.ename, cell.evalue, now - start)
        if box.connection_abuse():
            return CellResult(index, "abuse", seconds=now - start)
        until = next_look if interrupted is None else interrupted + grace
        ready = dict(await poller.poll(timeout=int(1000 * min(_POLL, max(0.0, until - now))) + 1))
        if kc.iopub_channel.socket in ready:
            await _drain(kc.iopub_channel, cell.on_iopub)
        if kc.shell_channel.socket in ready:
            await _drain(kc.shell_channel, cell.on_shell)
    seconds = time.monotonic() - start
    if interrupted is not None:
        return CellResult(index, reason, cell.ename, cell.evalue, seconds)
    failed = cell.reply.get("status") != "ok" or bool(cell.ename)
    return CellResult(index, "error" if failed else "ok", cell.ename, cell.evalue, seconds)


async def run_cells(cells: list[tuple[int, str]], box: KernelBox, *, cell_timeout: float, budget: Budget,
                    grace: float = 10.0, startup_timeout: float = 60.0) -> RunResult:
    """Start ``box``'s kernel, run the ``(index, source)`` cells in order until one does not finish, kill the whole
    sandbox. ``cell_timeout``: CPU seconds; ``budget`` covers the kernel's start too and gets its CPU seconds added."""
    from jupyter_client import AsyncKernelManager

    result = RunResult()
    context = zmq.asyncio.Context()
    context.setsockopt(zmq.MAXMSGSIZE, _MAX_MESSAGE)
    context.setsockopt(zmq.LINGER, 0)
    km = AsyncKernelManager(kernel_name=box.kernel_name, kernel_spec_manager=box.spec_manager(), transport="ipc",
                            ip=box.ip, connection_file=box.connection_file, context=context)
    kc = None
    try:
        try:
            await km.start_kernel(cwd=box.cwd, stdin=-3, stdout=-3, stderr=-3)  # subprocess.DEVNULL
            box.started(km.provisioner.pid)
            kc = km.client()
            kc.start_channels()
            await kc.wait_for_ready(timeout=max(1.0, min(startup_timeout, budget.wall_end - time.monotonic())))
        except Exception as exc:  # noqa: BLE001 - any start failure is reported, never raised
            result.startup_error = clean_text(f"{type(exc).__name__}: {exc}", 200)
            return result
        for index, source in cells:
            if reason := budget.over(box.cpu_seconds(), time.monotonic()):
                result.stop = CellResult(index, reason)
                break
            try:
                cell = await _execute(km, kc, box, index, source, cell_timeout, budget, grace)
            except Exception as exc:  # noqa: BLE001 - a malformed message, a vanished kernel: end this run
                cell = CellResult(index, "dead", type(exc).__name__, clean_text(exc, 200))
            result.cells[index] = cell
            if cell.status not in FINISHED:
                result.stop = cell
                break
        return result
    finally:
        if kc is not None:
            kc.stop_channels()
        await asyncio.to_thread(box.end)  # the whole sandbox, before the kernel manager reaps its own process
        budget.spent += box.cpu_seconds()
        with contextlib.suppress(Exception):  # already dead, never started
            await km.shutdown_kernel(now=True)
        context.destroy(linger=0)


def _event(plan: Plan, stop: CellResult, options: Options) -> str:
    where = plan.label(stop.index)
    memory = f"{options.limits.memory / GiB:g} GiB"
    cell, total = options.cell_timeout, options.timeout
    return {
        "timeout": f"{where} 超过单格时限 {cell:g} s(CPU 时间),已中断",
        "wall": f"{where} 墙钟时间超过 {WALL_FACTOR * cell:g} s(单格 CPU 时限 {cell:g} s 的 {WALL_FACTOR} 倍,"
                f"在 sleep 或等待?),已中断",
        "unresponsive": f"{where} 超时后 {options.grace:g} s 仍不响应中断(吞掉了 KeyboardInterrupt?),已终止内核,按崩溃处理",
        "dead": f"内核在运行 {where} 时退出(进程结束、崩溃或超出内存上限 {memory})",
        "deadline": f"超过整本 notebook 的总时限 {total:g} s(CPU 时间),已终止(在 {where})",
        "deadline_wall": f"整本 notebook 墙钟时间超过 {WALL_FACTOR * total:g} s(总 CPU 时限的 {WALL_FACTOR} 倍),"
                         f"已终止(在 {where})",
        "abuse": f"{where} 向内核的连接目录写入大量数据,已终止内核",
    }.get(stop.status, f"{where}: {stop.status}")


async def _run(plan: Plan, stubbed: dict[int, str], options: Options, private: Path, budget: Budget) -> RunResult:
    box = KernelBox(private, options.limits, options.threads, options.sandbox)
    try:
        return await run_cells(plan.code_cells(stubbed), box, cell_timeout=options.cell_timeout, budget=budget,
                               grace=options.grace)
    finally:
        box.close()


async def step(sub: Submission) -> None:
    """Run the notebook, again with each offending exercise stubbed (``sub.stubbed`` grows): the check cells'
    results in ``sub.outcomes``, and in ``sub.ended`` why the last run ended early ("" when it ran to the end)."""
    plan, options, notes = sub.plan, sub.options, sub.grade.notes
    budget = Budget(options.timeout)
    while True:
        result = await _run(plan, sub.stubbed, options, sub.private, budget)
        if result.startup_error:
            sub.ended = f"内核无法启动: {result.startup_error}"
            notes.append(sub.ended)
            return
        sub.outcomes.update({i: r for i, r in result.cells.items() if i in plan.checks})
        stop = result.stop
        if stop is None:
            return
        event = _event(plan, stop, options)
        offender = stop.index if stop.index in plan.exercises else max(
            (e for e in plan.exercises if e < stop.index), default=None)
        if stop.status in DEADLINES or offender is None or offender in sub.stubbed:
            sub.ended = event + ("" if stop.status in DEADLINES else
                                 ";问题不在某个练习里,无法重新运行" if offender is None else ";该练习已按未完成运行过,不再重试")
            notes.append(sub.ended)
            return
        sub.stubbed[offender] = event
        notes.append(f"{event};重新运行,{plan.label(offender)} 按未完成处理")
