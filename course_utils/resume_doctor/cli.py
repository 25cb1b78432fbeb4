"""``python -m course_utils.resume_doctor --steps N -- CMD...``: kill any training script at exact steps, resume it,
find the first state that differs from the uninterrupted run, name the cause.

What: the command runs once uninterrupted, then in chains killed (SIGKILL right after an exact optimizer
step) and resumed in the same folder: mid-epoch, right after the first epoch end (past its evaluation),
and twice in one chain. Every process is recorded step by step from outside its code
(:mod:`course_utils.resume_doctor.probe`); :mod:`~course_utils.resume_doctor.compare` finds the first
difference, :mod:`~course_utils.resume_doctor.explain` words it. Prints one short block, writes a JSON
report; exit 0 when every resume was exact, 1 when one differed, 2 for a usage error or a script that
fails by itself. The uninterrupted run starts in a fresh interpreter; the chains' processes are forked
from one that imported torch once (:mod:`~course_utils.resume_doctor.forks`; ``--fresh``: each in a
fresh interpreter), ``--jobs`` chains side by side.

Why kills by step count: a kill decided by watching a log races with the script, and on a busy machine
lands elsewhere; counting ``optimizer.step()`` inside the process gives the same kill at any load.

Pitfall: the script must be reproducible by itself (same seed, same threads: the doctor sets one thread
unless the environment says otherwise) and save checkpoints often enough for a kill to have something
to resume from. Quote the ``[...]`` argument in zsh.

Taught in ``04_checkpoint_resume`` §9; the homework checks (``course_tools/checks/homework_resume.py``)
share its machinery.

Example::

    python -m course_utils.resume_doctor --steps 40 -- python train.py --out {out} '[--resume]'
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from course_utils.resume_doctor.compare import Finding, compare_chain
from course_utils.resume_doctor.explain import explain, render
from course_utils.resume_doctor.forks import ForkServer
from course_utils.resume_doctor.runs import Command, Proc, UsageError, environ, kill_plan, parse_command, \
    run_chain, run_process

__all__ = ["EXACT", "DIFFERED", "ERROR", "diagnose", "examine", "main"]

EXACT, DIFFERED, ERROR = 0, 1, 2
_CHAIN_ORDER = {"mid": 0, "epoch_end": 1, "twice": 2}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m course_utils.resume_doctor",
        description="Kill a training command at exact optimizer steps, resume it, and name the first state that "
                    "differs from an uninterrupted run. CMD is the training command, unchanged: {out} stands for the "
                    "run folder; one argument in square brackets, e.g. '[--resume]', holds what only resumed runs add.",
        epilog="example: python -m course_utils.resume_doctor --steps 40 -- python train.py --out {out} '[--resume]'  "
               "(exit 0: every resume exact; 1: one differed; 2: usage error, or the script fails by itself)")
    p.add_argument("--steps", type=int, required=True, help="optimizer steps of an uninterrupted run of CMD")
    p.add_argument("--workdir", type=Path, help="where the run folders go (default: a new temporary folder)")
    p.add_argument("--report", type=Path, help="the JSON report (default: WORKDIR/report.json)")
    p.add_argument("--lang", choices=["zh", "en"], default="zh", help="language of the diagnosis (default zh)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per run unless OMP_NUM_THREADS is set (default 1)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one process may run (default 600)")
    p.add_argument("--jobs", type=int, default=_cores(),
                   help=f"chains run side by side (default: the CPU cores this process may use, here {_cores()}); "
                        "the verdict does not depend on it: the kills count optimizer steps")
    p.add_argument("--fresh", action="store_true",
                   help="start every process in a fresh interpreter (default: the uninterrupted run does, the chains' "
                        "processes are forked from one interpreter that has imported torch once)")
    p.add_argument("--chains", default="mid,epoch_end,twice",
                   help="which kill-and-resume chains to run, comma-separated (default: mid,epoch_end,twice)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- python SCRIPT ARG... (or python -m MODULE ARG...)")
    return p


def _first(findings: list[Finding]) -> Finding | None:
    found = [f for f in findings if f is not None]
    return min(found, key=lambda f: (f.step, f.when != "loaded", _CHAIN_ORDER.get(f.chain, 9)), default=None)


def diagnose(ref: Proc, chains: dict[str, tuple[list[int], list[Proc]]], n: int, epoch: int | None,
             lang: str = "zh") -> dict[str, Any]:
    """The report of the chains' comparison with ``ref`` (no runs here): verdict, each chain, the first finding."""
    report: dict[str, Any] = {"chains": {}}
    findings = []
    for name, (kills, procs) in chains.items():
        finding, info = compare_chain(ref, name, procs, n, epoch)
        findings.append(finding)
        report["chains"][name] = {"kills": kills, **info, "finding": finding.as_dict() if finding else None,
                                  "processes": [{"name": p.name, "kill": p.kill, "returncode": p.returncode,
                                                 "steps": len(p.steps)} for p in procs]}
    first = _first(findings)
    report["verdict"] = "differed" if first else "exact"
    if first is not None:
        what, meaning, fix = explain(first, lang)
        report["first"] = {**first.as_dict(), "what": what, "meaning": meaning, "fix": fix}
    return report


def _reference_error(ref: Proc, n: int, lang: str) -> str | None:
    zh = lang == "zh"
    if ref.returncode != 0:
        return (f"不中断的运行自己就失败了(退出码 {ref.returncode}):\n{ref.tail()}" if zh
                else f"the uninterrupted run fails by itself (exit {ref.returncode}):\n{ref.tail()}")
    if not ref.steps:
        return ("没有记录到 torch.optim 优化器的 step():脚本不用 torch.optim,或 CMD 不是训练命令" if zh
                else "no torch.optim optimizer step was recorded: the script does not use torch.optim")
    if len(ref.steps) != n:
        return (f"不中断的运行做了 {len(ref.steps)} 个优化器步,--steps 说是 {n}" if zh
                else f"the uninterrupted run made {len(ref.steps)} optimizer steps, --steps says {n}")
    return None


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _run_chains(cmd: Command, workdir: Path, plan: dict[str, list[int]], timeout: float, env: dict[str, str],
                jobs: int, server: ForkServer | None) -> dict[str, tuple[list[int], list[Proc]]]:
    """The chains, ``jobs`` at a time, the longest first."""
    order = sorted(plan, key=lambda name: -len(plan[name]))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {name: pool.submit(run_chain, cmd, workdir / name, plan[name], timeout, env, server) for name in order}
        return {name: (plan[name], futures[name].result()) for name in plan}


def examine(cmd: Command, n: int, workdir: Path, *, lang: str = "zh", threads: int = 1, timeout: float = 600.0,
            jobs: int | None = None, chains: tuple[str, ...] = tuple(_CHAIN_ORDER), fresh: bool = False) -> dict[str, Any]:
    """Run the reference and the ``chains`` of ``cmd`` in ``workdir``; the report (``exit_code`` included).

    The uninterrupted run starts in a fresh interpreter while the fork server (unless ``fresh``) imports torch."""
    start, env = time.monotonic(), environ(threads)
    server = None if fresh else ForkServer(cmd.python, env, workdir / "forks.log")
    try:
        ref = run_process(cmd, workdir / "ref", 0, resumed=False, kill=None, timeout=timeout, env=env)
        error = _reference_error(ref, n, lang)
        report: dict[str, Any] = {"steps": n, "workdir": str(workdir), "lang": lang}
        if error is not None:
            report.update(verdict="error", error=error, chains={}, notes=[], exit_code=ERROR)
            return report
        plan, epoch, notes = kill_plan(ref, n)
        plan = {name: kills for name, kills in plan.items() if name in chains}
        if server is not None and not server.usable(timeout):
            notes.append(f"the fork server did not start (see {workdir / 'forks.log'}): every process started fresh")
            server.close()
            server = None
        chains = _run_chains(cmd, workdir, plan, timeout, env, jobs or _cores(), server)
    finally:
        if server is not None:
            server.close()
    unkilled = [f"{name}: p{i}" for name, (kills, procs) in chains.items()
                for i, p in enumerate(procs) if i < len(kills) and not p.killed()]
    report.update(diagnose(ref, chains, n, epoch, lang), epoch_steps=epoch, notes=notes)
    if unkilled and report["verdict"] == "exact":
        report.update(verdict="error", error=f"not killed as planned (ended before the kill step): {unkilled}")
    report["exit_code"] = {"exact": EXACT, "differed": DIFFERED, "error": ERROR}[report["verdict"]]
    report["seconds"] = round(time.monotonic() - start, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (0 exact, 1 differed, 2 usage error or the script fails by itself)."""
    parser = _parser()
    args = parser.parse_args(argv)
    cmd_args = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    chains = tuple(c for c in args.chains.split(",") if c)
    try:
        if args.steps < 2:
            raise UsageError("--steps must be at least 2")
        if not chains or set(chains) - set(_CHAIN_ORDER):
            raise UsageError(f"--chains takes some of {','.join(_CHAIN_ORDER)}: {args.chains}")
        cmd = parse_command(cmd_args)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return ERROR
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="resume_doctor_"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = examine(cmd, args.steps, workdir, lang=args.lang, threads=args.threads, timeout=args.timeout,
                     jobs=args.jobs, chains=chains, fresh=args.fresh)
    report["command"] = cmd_args
    path = args.report or workdir / "report.json"
    report["path"] = str(path)
    path.write_text(json.dumps(report, ensure_ascii=False, indent=1), encoding="utf-8")
    print(render(report, args.lang))
    return report["exit_code"]
