"""Kill and resume a learner's training script: the machinery of upgrades 2 and 4 (``check_resume``, ``check_ema``).

Reference machinery of the homework checks (:mod:`course_tools.checks.nb10_homework`). :func:`interrupted_and_resumed`
kills one command twice at exact optimizer steps and resumes it; the resumed runs must continue the killed runs'
logs and the reference's losses exactly (one thread on the CPU: a correct resume is bit-identical). Every run goes
through the resume doctor's probe (:mod:`course_utils.resume_doctor`): where a resume differs, the doctor names the
first component that differs (fp16 weights, the step counter, the data order, the RNG state, the EMA ...) in its
own words; a script without a torch optimizer has no records, and its failures fall back to what the losses say.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_tools.checks import CheckFailed, expect, fail
from course_tools.checks import untrusted_files as files
from course_tools.checks.homework_runs import Launcher, Run, run_all, watch
from course_utils.resume_doctor.compare import Finding, compare_chain
from course_utils.resume_doctor.explain import headline
from course_utils.resume_doctor.runs import Proc, parse_records

__all__ = ["Resumed", "Interrupted", "EPOCH_END_HINT", "POLLED_NOTE", "DOCTOR", "interrupted_and_resumed", "polled_note",
           "diagnosis", "ema_hint"]


@dataclass
class Resumed:
    """A run killed at one point, then resumed with ``--resume``."""

    where: str                            # the kill point in words: "epoch 中间" / "epoch 结尾"
    run: Run                              # the resumed process
    killed_at: int                        # the last step the killed process logged
    first: int                            # the resumed process's first step
    after: dict[int, dict[str, Any]]      # its training records
    polled: bool = False                  # the kill came from watching the log (no torch.optim step to count)
    finding: Finding | None = None        # the resume doctor's first difference (None: none, or no records)


@dataclass
class Interrupted:
    """An uninterrupted run, and the same command killed mid-epoch and at an epoch end, each resumed."""

    ref: Run                              # the uninterrupted run
    reference: dict[int, dict[str, Any]]  # the uninterrupted run's training records
    resumes: list[Resumed]               # mid-epoch, then epoch end


EPOCH_END_HINT = ("每个 epoch 结束时评估一次,写一条 \"split\": \"val\" 记录(约定 2):检查用第一条找到 epoch 的结尾,"
                  "在那之后再 kill 一次")


def _epoch_end(ref: Run, total_steps: int) -> int | None:
    """The step of the reference's first evaluation record before its last step: the end of its first epoch."""
    steps = [r["step"] for r in ref.records() if isinstance(r, dict) and r.get("split") == "val"
             and isinstance(r.get("step"), int) and 0 < r["step"] < total_steps]
    return min(steps, default=None)


def _with_flag(args: list[str], flag: str, value: str) -> list[str]:
    i = args.index(flag)
    return [*args[:i + 1], value, *args[i + 2:]]


def _killed(run: Run, total_steps: int) -> int:
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


def interrupted_and_resumed(script: Path, common: list[str], tmp: Path, launcher: Launcher | None, total_steps: int,
                            kill_after: int, extra: list[Run] = ()) -> Interrupted:
    """Run ``common`` to the end (the reference) and twice more, each SIGKILLed at an exact step and resumed.

    Kill points: after step ``kill_after`` (mid-epoch, checkpoints as ``common`` says) and after
    the first step of the second epoch, with a checkpoint at every epoch end (``--ckpt-every-steps``
    = the epoch's length, read from the reference's first evaluation record). Whatever the
    script does between a save and the next step (an evaluation whose ``DataLoader`` draws from
    the global generator) then shows. ``extra`` runs beside them. Each killed run's ``metrics.jsonl``
    is moved out of its folder, then both resume side by side. Fails on a run that cannot be killed
    mid-training.
    """
    ref, reference, mid, end = _run_and_kill(script, common, tmp, launcher, total_steps, kill_after, list(extra))
    killed = [(mid, "epoch 中间", _killed(mid, total_steps)), (end, "epoch 结尾", _killed(end, total_steps))]
    resumed, befores = [], []
    for run, _, _ in killed:
        befores.append(run.train_steps())
        os.replace(run.out / "metrics.jsonl", tmp / f"{run.out.name}.before_kill.jsonl")  # out of the resumed one's reach
        again = Run(script, [*run.args[2:], "--resume"], tmp, run.out.name, "--resume 续训", launcher,
                    log_name=f"{run.out.name}.resume", record=True)
        again.advice = ("错在加载检查点时,可能是读到了只写了一半的文件: 检查点要原子写入"
                        "(先写临时文件再 os.replace),CheckpointManager 已经这样做了。")
        resumed.append(again)
    run_all(resumed, limit=total_steps, resumed=True)
    epoch_end = end.kill_after - 1
    findings = [diagnosis(ref, run, again, where, total_steps, epoch_end) for (run, where, _), again in zip(killed, resumed)]
    resumes = [_verify(again, where, killed_at, before, reference, total_steps, epoch_end, run.polled, finding)
               for (run, where, killed_at), again, before, finding in zip(killed, resumed, befores, findings)]
    return Interrupted(ref, reference, resumes)


DOCTOR = "续训医生(python -m course_utils.resume_doctor)逐步比较了保存的状态: "


def _proc(run: Run) -> Proc:
    """What the probe recorded of one run (the file is the learner process's: read with a cap, parsed leniently)."""
    data = files.read_untrusted_bytes(run.record, files.METRICS_CAP) if run.record is not None else None
    loaded, steps = parse_records(data.decode("utf-8", errors="replace") if data else "")
    return Proc(run.out.name, run.kill_after, run.proc.returncode, run.log, loaded, steps)


def diagnosis(ref: Run, killed: Run, resumed: Run, where: str, total_steps: int, epoch: int) -> Finding | None:
    """The resume doctor's first difference of the chain ``killed`` -> ``resumed`` from ``ref``; None when it finds
    none or the records cannot tell (no torch optimizer, or files the script wrote into)."""
    try:
        reference = _proc(ref)
        if reference.loaded is None or len(reference.steps) != total_steps:
            return None
        return compare_chain(reference, where, [_proc(killed), _proc(resumed)], total_steps, epoch)[0]
    except (CheckFailed, KeyError, TypeError, ValueError, IndexError, AttributeError):
        return None


def ema_hint(resumed: Resumed, fallback: str) -> str:
    """The hint of a resumed EMA that differs: the doctor's cause when it found one, else ``fallback``."""
    if resumed.finding is not None and resumed.finding.component in ("ema", "grad_scaler"):
        return DOCTOR + headline(resumed.finding)
    return fallback


def _run_and_kill(script: Path, common: list[str], tmp: Path, launcher: Launcher | None, total_steps: int,
                  kill_after: int, extra: list[Run]) -> tuple[Run, dict[int, dict[str, Any]], Run, Run]:
    """The reference (and its training records), the mid-epoch kill and (started once the reference logged its
    first epoch end) the epoch-end kill, side by side with ``extra``; all of them ended."""
    ref = Run(script, common, tmp, "ref", "不中断的参照运行", launcher, record=True)
    mid = Run(script, common, tmp, "mid", "在 epoch 中间被中断的运行", launcher, kill_after=kill_after)
    runs = [ref, mid, *extra]
    cut: list[Run] = []

    def start_epoch_end() -> None:
        end = None if cut else _epoch_end(ref, total_steps)
        if end is not None:
            cut.append(Run(script, _with_flag(common, "--ckpt-every-steps", str(end)), tmp, "end",
                           f"在 epoch 结尾(step {end})之后被中断的运行", launcher, kill_after=end + 1).start())
            runs.append(cut[0])

    for r in runs:
        r.start()
    try:
        watch(runs, limit=total_steps, on_poll=start_epoch_end)
    finally:
        for r in runs:
            r.kill()
    reference = files.read_train_records(ref.out)
    expect(bool(cut), f"{ref.what}在每个 epoch 结束时写一条评估记录", f"{total_steps} 步里没有一条 step < {total_steps} 的"
           " \"split\": \"val\" 记录", EPOCH_END_HINT)
    return ref, reference, mid, cut[0]


def _verify(resumed: Run, where: str, killed_at: int, before: dict[int, dict[str, Any]],
            reference: dict[int, dict[str, Any]], total_steps: int, epoch_end: int, polled: bool,
            finding: Finding | None = None) -> Resumed:
    """The resumed run continues the killed one's log (``before``: its training records) and the reference's
    losses, step by step, exactly; ``finding``: the resume doctor's first difference (its words become the hint)."""
    expect((resumed.out / "metrics.jsonl").exists(), "续训进程也写 metrics.jsonl", "续训后没有这个文件",
           "--resume 时追加或重新创建 metrics.jsonl 都可以")
    after = files.read_train_records(resumed.out)
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
    mismatched = [s for s in sorted(after) if s not in reference or after[s]["loss"] != reference[s]["loss"]]
    doctor = finding if finding is not None and finding.component not in ("ema", "grad_scaler") else None
    if mismatched or doctor is not None:
        expected = f"在 {where}被 kill、续训后的 loss 与不中断的运行逐步相同(曲线无缝衔接,CPU 上逐位一致)"
        if not mismatched:
            fail(expected, f"loss 逐步相同,但续训后的状态不同(step {doctor.step})", DOCTOR + headline(doctor))
        s = mismatched[0]
        ref_loss = f"{reference[s]['loss']:.7g}" if s in reference else "没有这一步"
        mid_ok = "从 epoch 中间续训是一致的;" if where == "epoch 结尾" else ""  # the mid-epoch resume passed first
        hint = mid_ok + DOCTOR + headline(doctor) if doctor is not None else _loss_hint(where, s, first, epoch_end)
        fail(expected, f"step {s}: 续训 {after[s]['loss']:.7g} vs 不中断 {ref_loss}", hint)
    return Resumed(where, resumed, killed_at, first, after, polled, finding)


def _loss_hint(where: str, s: int, first: int, epoch_end: int) -> str:
    """What the losses alone suggest (a script whose steps the doctor could not record)."""
    if where == "epoch 结尾":
        return (f"从 epoch 中间续训是一致的,从 epoch 结尾(step {epoch_end})的检查点续训却对不上:存下这份检查点之后、"
                "下一步训练之前,脚本又从 torch 的全局随机数生成器取过数,检查点里的随机数状态已经不是训练接着用的"
                "那个(dropout 的掩码随之改变)。最常见的是评估: 普通的 DataLoader 每次 iter() 都从全局生成器取一个种子,"
                "shuffle=False 也一样。评估用 make_loader(test_set, 512, shuffle=False)(它有自己的 generator),"
                "或者评估完再存检查点")
    if s == first:
        return ("续训后的第一步就不同: 这一步的 batch、模型权重或 dropout 的随机掩码和原来的不一样。"
                "数据顺序要只取决于 (seed, epoch),并从 epoch 中间接着取: "
                "make_loader(ds, bs, seed=seed, epoch=epoch, start_batch=k);dropout 的掩码取自 torch 的全局"
                "随机数生成器,它的随机数状态也要存进检查点并恢复")
    return (f"续训后第一步一致,从 step {s} 起偏离: 权重对了,但优化器状态(AdamW 的动量)、学习率调度"
            "或随机数状态没有完整恢复")


POLLED_NOTE = ("。注意: 脚本没有调用 torch.optim 优化器的 step(),检查只能在 metrics.jsonl 出现那一步时 kill 它,"
               "kill 的时机取决于机器忙不忙")


def polled_note(got: Interrupted) -> str:
    """The note a passed check adds when a kill came from watching the log."""
    return POLLED_NOTE if any(r.polled for r in got.resumes) else ""
