"""Behaviour checks for the chapter 0.4 homework: run the learner's scripts, never read their code.

Reference machinery (the homework of ``10_homework``). Each check starts the learner's script as a subprocess,
exactly as the 约定 (contract) block at the end of its section in ``10_homework.ipynb`` shows (flags, files,
records: the contract is stated there once), then reads the files the script wrote; each check's docstring says
what it requires. ``UPGRADES`` lists the five in order for the grader (``course_grader``); every check takes a
``launcher`` (``LOCAL``, or the grader's sandbox) and a ``workdir`` (where the run folders go), and prints the
absolute path of the script it runs. The seeds are fixed (``seed=1234``): a failure reproduces with the command
its message prints. Example::

    from course_tools.checks.nb10_homework import check_config
    check_config("notebooks/homework/train_cifar.py")
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_tools.checks import exercise_check, expect, passed
from course_tools.checks import untrusted_files as files
from course_tools.checks.homework_resume import ema_hint, interrupted_and_resumed, polled_note
from course_tools.checks.homework_runs import Launcher, Run, announce, run_all, scratch
from course_tools.checks.homework_started import started
from course_tools.checks.upgrades import HEALTHY, TRAIN, TWIN, UPGRADE_LIST, UpgradeInfo
from course_utils.repro import git_commit

__all__ = ["SEED", "SMALL_RUN", "RESUME_RUN", "Upgrade", "UPGRADES", "TRAIN", "HEALTHY", "TWIN", "check_config",
           "check_resume", "check_clipping", "check_ema", "check_overfit", "HINTS"]


SEED = 1234
# Tiny runs: the smallest model on 10% of the data; --max-steps ends them, not --epochs.
SMALL_RUN = ["--model", "tiny", "--data-fraction", "0.1", "--batch-size", "32", "--epochs", "1000"]
RESUME_RUN = ["--dropout", "0.5", *SMALL_RUN]  # dropout: the global generator's state matters on resume


def _losses(records: dict[int, dict[str, Any]]) -> list[float]:
    """The losses by step, rounded for a message."""
    return [round(records[s]["loss"], 5) for s in sorted(records)]


def _finish(message: str, start: float) -> str:
    message = f"{message}(用时 {time.monotonic() - start:.0f} s)"
    passed(message)
    return message


# ------------------------------------------------------------------ upgrade 1

@exercise_check
def check_config(script: str | os.PathLike, seed: int = SEED, *, launcher: Launcher | None = None,
                 workdir: Path | None = None, commit: str | None = None) -> str:
    """Upgrade 1: ``--seed`` makes runs repeatable, and ``config.json`` records seed and commit.

    ``commit``: None, the recorded commit must be ``git rev-parse HEAD`` of the script's folder
    (when it is in a git repository); a hash, it must be that one; ``""`` (no history known), any
    non-empty value of a key naming the commit will do.
    """
    script = started(script, 1)
    announce(script)
    start = time.monotonic()
    with scratch(workdir, "config") as tmp:
        a, b, c = (Run(script, ["--seed", str(s), "--max-steps", "3", *SMALL_RUN], tmp, name, f"--seed {s} 的运行",
                        launcher) for name, s in (("a", seed), ("b", seed), ("c", seed + 1)))
        run_all([a, b, c], limit=3)
        config = files.read_config(a.out)
        seeds = files.config_values(config, "seed")
        expect(seed in seeds, f"config.json 里 seed = {seed}(本次传入的 --seed)", f"找到的 seed: {seeds or '无'}",
               "把全部命令行参数写进去: dump_run_config(args.out, vars(args))")
        commits = [v for v in files.config_values(config, "commit", substring=True) if isinstance(v, str) and v.strip()]
        expect(bool(commits), "config.json 里有 git commit(键名含 commit)", "没有",
               "dump_run_config 会写 git_commit;自己写时用 git rev-parse HEAD")
        head = git_commit(script.parent)[0] if commit is None else commit
        if head and head != "unknown":
            expect(head in commits, f"记录的 commit 等于当前 HEAD {head[:10]}", f"{commits}",
                   "commit 要取脚本所在仓库的 HEAD")
        ra, rb, rc = (files.read_train_records(run.out) for run in (a, b, c))
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

@exercise_check
def check_resume(script: str | os.PathLike, seed: int = SEED, total_steps: int = 60, kill_after: int = 25,
                 every: int = 10, *, launcher: Launcher | None = None, workdir: Path | None = None) -> str:
    """Upgrade 2: SIGKILL, ``--resume``: the loss curve equals the uninterrupted run's, from two kill points.

    The same command (same seed, and dropout, so the global RNG state matters) runs to the end as the reference,
    and is SIGKILLed twice more right after an exact optimizer step (no chance to save; every run recorded by
    the resume doctor's probe): after step ``kill_after`` (mid-epoch) and after the first step that follows the
    first epoch end, with a checkpoint at that epoch end. Each killed run's ``metrics.jsonl`` is moved aside and
    it resumes: the resumed process must start after step 1, its losses must equal the reference's exactly, and
    its recorded states too (else the doctor's first difference names the cause).
    """
    script = started(script, 2)
    announce(script)
    start = time.monotonic()
    with scratch(workdir, "resume") as tmp:
        common = ["--seed", str(seed), "--max-steps", str(total_steps), "--ckpt-every-steps", str(every), *RESUME_RUN]
        got = interrupted_and_resumed(script, common, tmp, launcher, total_steps, kill_after)
    mid, end = got.resumes
    return _finish(f"升级 2: 两次 SIGKILL 后,从 step {mid.first - 1}(epoch 中间)和 step {end.first - 1}(epoch 结尾,"
                   f"评估之后)的检查点各续训一次,之后每一步的 loss 都与不中断的运行逐位相同{polled_note(got)}",
                   start)


# ------------------------------------------------------------------ upgrade 3

@exercise_check
def check_clipping(script: str | os.PathLike, seed: int = SEED, steps: int = 6, *, launcher: Launcher | None = None,
                   workdir: Path | None = None) -> str:
    """Upgrade 3: the pre-clip grad norm is logged each step, ``clipped`` says when clipping fired,
    and the clip acts: ``--clip 1e-4`` and ``--clip 1e6`` give different losses after step 1."""
    script = started(script, 3)
    announce(script)
    start = time.monotonic()
    tight_clip = 1e-4
    with scratch(workdir, "clipping") as tmp:
        runs = [Run(script, ["--seed", str(seed), "--clip", clip, "--max-steps", str(steps), *SMALL_RUN], tmp, name,
                     f"--clip {clip} 的运行", launcher) for name, clip in (("tight", "1e-4"), ("loose", "1e6"))]
        run_all(runs, limit=steps)
        tight, loose = (files.read_train_records(run.out) for run in runs)
        for recs in (tight, loose):
            for step, rec in recs.items():
                expect("grad_norm" in rec and "clipped" in rec, "每条训练记录都有 grad_norm 和 clipped",
                       f"step {step} 的记录只有 {sorted(rec)}", "两项都写进每一步的那一行 JSON")
                g = rec["grad_norm"]
                expect(files.is_number(g) and g > 0, "grad_norm 是有限正数", f"step {step}: {g!r}",
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


def _final_eval(run: Run, step: int, ema: bool) -> dict[str, Any]:
    """The last ``"split": "val"`` record at ``step``, with its numbers checked."""
    found = [r for r in run.records() if isinstance(r, dict) and r.get("split") == "val" and r.get("step") == step]
    expect(bool(found), f"{run.what} 在训练结束时(step {step})写一条评估记录",
           f'metrics.jsonl 里没有 "split": "val"、"step": {step} 的记录',
           "训练结束时(到 --max-steps 为止)评估一次,把结果作为一行 JSON 写进 metrics.jsonl")
    rec = found[-1]
    keys = ["loss", "acc", "loss_ema", "acc_ema"] if ema else ["loss", "acc"]
    bad = [k for k in keys if not files.is_number(rec.get(k))]
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


@exercise_check
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
    script = started(script, 4)
    announce(script)
    start = time.monotonic()
    with scratch(workdir, "ema") as tmp:
        def short(name: str, decay: str, steps: int) -> Run:
            return Run(script, ["--seed", str(seed), "--max-steps", str(steps), "--ema-decay", decay, *RESUME_RUN],
                        tmp, name, f"--ema-decay {decay} 的运行", launcher)

        off, near = short("off", "0", 3), short("near", NEAR_ZERO, 10)
        common = ["--seed", str(seed), "--max-steps", str(total_steps), "--ckpt-every-steps", str(every),
                  "--ema-decay", EMA_DECAY, *RESUME_RUN]
        got = interrupted_and_resumed(script, common, tmp, launcher, total_steps, kill_after, extra=[off, near])
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
                       ema_hint(r, "EMA 的状态要存进检查点并在 --resume 时恢复(EMA.state_dict() 含权重和更新次数;"
                                "training_state(..., ema=ema) / restore_training_state(..., ema=ema))"))
    mid, end = got.resumes
    return _finish(f"升级 4: EMA 与原始权重并排评估(loss {ref['loss']:.4f}, loss_ema {ref['loss_ema']:.4f}),"
                   f"decay 趋近 0 时两者一致;从 step {mid.first - 1}(epoch 中间)和 step {end.first - 1}(epoch 结尾)"
                   f"的检查点续训,最后的 EMA 评估都与不中断的运行相同{polled_note(got)}", start)


# ------------------------------------------------------------------ upgrade 5

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@exercise_check
def check_overfit(healthy: str | os.PathLike, broken: str | os.PathLike, seed: int = SEED, steps: int = 150, *,
                  launcher: Launcher | None = None, workdir: Path | None = None) -> str:
    """Upgrade 5: ``debug_overfit.py`` memorises one batch (exit 0) and saves ``samples.png``;
    the label-broken twin cannot memorise (exit != 0)."""
    healthy, broken = started(healthy, 5), started(broken, 5)
    announce(healthy, broken)
    start = time.monotonic()
    with scratch(workdir, "overfit") as tmp:
        args = ["--steps", str(steps), "--batch-size", "32", "--model", "tiny", "--seed", str(seed)]
        ok_run = Run(healthy, args, tmp, "ok", healthy.name, launcher)
        bad_run = Run(broken, args, tmp, "bad", broken.name, launcher)
        rc_ok, rc_bad = run_all([ok_run, bad_run], limit=steps, ok=False)
        ok, bad = files.read_train_records(ok_run.out), files.read_train_records(bad_run.out)
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
        png = files.read_untrusted_bytes(ok_run.out / "samples.png", files.METRICS_CAP)
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
    """One upgrade of :data:`~course_tools.checks.upgrades.UPGRADE_LIST` with its check function."""

    info: UpgradeInfo
    check: Callable[..., str]

    number = property(lambda self: self.info.number)
    title = property(lambda self: self.info.title)
    scripts = property(lambda self: self.info.scripts)
    patch = property(lambda self: self.info.patch)

    def run(self, folder: Path, **kw: Any) -> str:
        """Run the check on the scripts in ``folder``; the passed message, or :class:`CheckFailed`.

        ``kw``: ``launcher``, ``workdir``, ``seed``; ``commit`` reaches only the check that reads it.
        """
        if self.check is not check_config:
            kw.pop("commit", None)
        return self.check(*(Path(folder) / name for name in self.scripts), **kw)


_CHECKS = {f.__name__: f for f in (check_config, check_resume, check_clipping, check_ema, check_overfit)}
UPGRADES: tuple[Upgrade, ...] = tuple(Upgrade(info, _CHECKS[info.check]) for info in UPGRADE_LIST)


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
        "常错的几处:没存或没恢复随机数状态(--dropout 让它立刻暴露);数据从 epoch 开头重新取;权重存成 fp16;续训时 step 少算一步或从 1 重新数;"
        "metrics.jsonl 没有在存检查点前 flush;检查点不是原子写入。python -m course_utils.resume_doctor 逐步找出第一处不同",
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
        "常错的几处:decay 和 1-decay 写反;在优化器更新之前就更新 EMA;EMA 没存进检查点或续训时没恢复(续训医生会指出);"
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
