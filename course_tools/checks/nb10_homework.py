"""Behaviour checks for the chapter 0.4 homework: run the learner's scripts, never read their code.

The contract a training script must meet (``notebooks/homework/train_cifar.py`` after
the four upgrades; ``solutions/homework/train_cifar_pro.py`` meets it):

- flags: ``--out DIR --seed N --epochs N --batch-size N --lr X --max-steps N --resume
  --clip MAX_NORM --ckpt-every-steps N --model {small,tiny} --data-fraction F``;
- ``DIR/config.json``: JSON holding the seed (a key ``seed``, at any depth) and the git
  commit (a key whose name contains ``commit``);
- ``DIR/metrics.jsonl``: one JSON object per optimizer step with ``step`` (1, 2, ...),
  ``loss``, ``grad_norm`` (the PRE-clip global norm) and ``clipped`` (bool); flushed at
  least at every checkpoint. Eval records may be mixed in if they carry ``"split": "val"``;
- ``--resume``: continue from the newest checkpoint in ``DIR``, appending to (or
  recreating) ``metrics.jsonl``; step numbers continue.

The overfit scripts (``debug_overfit.py`` and ``debug_overfit_broken_labels.py``) take
``--out --steps --batch-size --model --seed``, write ``DIR/metrics.jsonl`` (``step``,
``loss``, ``grad_norm``) and exit 0 when the batch was memorised, non-zero otherwise
with a message.

Example::

    from course_tools.checks.nb10_homework import check_config, check_resume, check_clipping, check_overfit
    check_config("notebooks/homework/train_cifar.py")
"""
from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from course_tools.checks import expect, passed
from course_tools.quiet import quiet_environ
from course_utils.monitor import read_metrics
from course_utils.repro import git_commit

__all__ = ["SMALL_RUN", "TIMEOUT", "read_train_records", "check_config", "check_clipping", "check_resume",
           "check_overfit"]


# Tiny runs: the smallest model on 10% of the data, a handful of steps.
SMALL_RUN = ["--model", "tiny", "--data-fraction", "0.1", "--batch-size", "32", "--epochs", "1000"]
TIMEOUT = 600


def _env() -> dict[str, str]:
    return {**quiet_environ(), "PYTHONUNBUFFERED": "1"}


def _script(path: str | os.PathLike) -> Path:
    p = Path(path).resolve()
    expect(p.is_file(), f"脚本 {p} 存在", "找不到这个文件")
    return p


def _start(script: Path, args: list[str], log: Path) -> subprocess.Popen:
    handle = open(log, "w", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, str(script), *args], stdout=handle, stderr=subprocess.STDOUT,
                            env=_env(), cwd=script.parent)
    proc._log_handle = handle  # type: ignore[attr-defined]
    return proc


def _finish(proc: subprocess.Popen, log: Path, what: str, expect_ok: bool = True) -> int:
    try:
        rc = proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"期望 {what} 在 {TIMEOUT} s 内结束;实际超时") from None
    finally:
        proc._log_handle.close()  # type: ignore[attr-defined]
    if expect_ok and rc != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-6:]
        raise AssertionError(f"期望 {what} 正常结束(退出码 0);实际退出码 {rc}:\n    " + "\n    ".join(tail))
    return rc


def _run_all(jobs: list[tuple[Path, list[str], Path, str]], expect_ok: bool = True) -> list[int]:
    """Start the jobs side by side (they are tiny), wait for all of them."""
    procs = [(_start(script, args, log), log, what) for script, args, log, what in jobs]
    codes = []
    try:
        for proc, log, what in procs:
            codes.append(_finish(proc, log, what, expect_ok))
    finally:
        for proc, _, _ in procs:
            if proc.poll() is None:
                proc.kill()
    return codes


def read_train_records(out: Path) -> dict[int, dict[str, Any]]:
    """Training records of ``out/metrics.jsonl`` by step (the last record of a step wins)."""
    path = out / "metrics.jsonl"
    expect(path.exists(), f"{path.name} 出现在 --out 目录里", "没有这个文件")
    records: dict[int, dict[str, Any]] = {}
    for rec in read_metrics(path):
        if not isinstance(rec, dict) or rec.get("split", "train") != "train" or "loss" not in rec:
            continue
        expect("step" in rec, "每条训练记录都有 step", f"记录 {rec}")
        records[int(rec["step"])] = rec
    expect(len(records) > 0, f"{path.name} 里至少有一条训练记录(含 step 和 loss)", "一条也没有")
    return records


def _find(obj: Any, key_test) -> list[Any]:
    """Values of every key (at any depth) for which ``key_test(key)`` is true."""
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if key_test(str(k)):
                found.append(v)
            found += _find(v, key_test)
    elif isinstance(obj, list):
        for v in obj:
            found += _find(v, key_test)
    return found


def check_config(script: str | os.PathLike) -> None:
    """Upgrade 1: ``--seed`` makes runs repeatable, and ``config.json`` records seed and commit."""
    script = _script(script)
    seed = random.randint(1, 9999)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        jobs = [(script, ["--out", str(tmp / name), "--seed", str(s), "--max-steps", "3", *SMALL_RUN],
                 tmp / f"{name}.log", f"seed={s} 的运行") for name, s in (("a", seed), ("b", seed), ("c", seed + 1))]
        _run_all(jobs)
        cfg_path = tmp / "a" / "config.json"
        expect(cfg_path.exists(), "--out 目录里有 config.json", "没有")
        try:
            config = json.loads(cfg_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise AssertionError(f"期望 config.json 是合法 JSON;实际 {exc}") from None
        seeds = _find(config, lambda k: k == "seed")
        expect(seed in seeds, f"config.json 里 seed = {seed}(本次传入的 --seed)", f"找到的 seed: {seeds or '无'}")
        commits = [c for c in _find(config, lambda k: "commit" in k.lower()) if isinstance(c, str)]
        expect(bool(commits), "config.json 里有 git commit(键名含 commit)", "没有")
        head, _ = git_commit(script.parent)
        if head != "unknown":
            expect(head in commits, f"记录的 commit 等于当前 HEAD {head[:10]}", f"{commits}")
        a, b, c = (read_train_records(tmp / n) for n in ("a", "b", "c"))
        steps = sorted(a)
        expect(steps == [1, 2, 3], "--max-steps 3 恰好训练 3 步(step 1, 2, 3)", f"steps {steps}")
        same = all(math.isclose(a[s]["loss"], b[s]["loss"], rel_tol=1e-6, abs_tol=1e-7) for s in steps if s in b)
        expect(same and sorted(b) == steps, "同一个 --seed 跑两次,每步 loss 完全相同",
               f"{[round(a[s]['loss'], 6) for s in steps]} vs {[round(b[s]['loss'], 6) for s in sorted(b)]}")
        differ = any(abs(a[s]["loss"] - c[s]["loss"]) > 1e-6 for s in steps if s in c)
        expect(differ, "换一个 --seed,loss 随之改变(seed 真的被用上)", "两个 seed 的 loss 一模一样")
    passed(f"升级 1: seed={seed} 两次运行逐步一致,换 seed 会变;config.json 记录了 seed 和 commit")


def check_clipping(script: str | os.PathLike) -> None:
    """Upgrade 3: the pre-clip grad norm is logged each step and ``clipped`` says when clipping fired."""
    script = _script(script)
    seed = random.randint(1, 9999)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        runs = {"tight": "1e-4", "loose": "1e6"}
        jobs = [(script, ["--out", str(tmp / name), "--seed", str(seed), "--clip", clip, "--max-steps", "6",
                          *SMALL_RUN], tmp / f"{name}.log", f"--clip {clip} 的运行") for name, clip in runs.items()]
        _run_all(jobs)
        tight, loose = read_train_records(tmp / "tight"), read_train_records(tmp / "loose")
        for name, recs in (("tight", tight), ("loose", loose)):
            for step, rec in recs.items():
                expect("grad_norm" in rec and "clipped" in rec, "每条训练记录都有 grad_norm 和 clipped",
                       f"step {step} 的记录: {sorted(rec)}")
                expect(isinstance(rec["grad_norm"], (int, float)) and math.isfinite(rec["grad_norm"])
                       and rec["grad_norm"] > 0, "grad_norm 是有限正数", f"step {step}: {rec['grad_norm']!r}")
        expect(all(bool(r["clipped"]) for r in tight.values()), "--clip 1e-4 时每一步 clipped 都为 true",
               f"{[bool(r['clipped']) for r in tight.values()]}")
        expect(not any(bool(r["clipped"]) for r in loose.values()), "--clip 1e6 时没有一步被裁剪",
               f"{[bool(r['clipped']) for r in loose.values()]}")
        g_tight, g_loose = tight[min(tight)]["grad_norm"], loose[min(loose)]["grad_norm"]
        expect(math.isclose(g_tight, g_loose, rel_tol=1e-3), "第 1 步两次运行的 grad_norm 相同(记录的是裁剪前的范数)",
               f"--clip 1e-4: {g_tight:.4g};--clip 1e6: {g_loose:.4g}")
        expect(g_tight > 1e-3, "grad_norm 是裁剪前的范数(远大于阈值 1e-4)", f"{g_tight:.4g}")
    passed(f"升级 3: 每步记录裁剪前的 grad norm(第 1 步 {g_loose:.3f}),clipped 在阈值 1e-4 时全为 true、1e6 时全为 false")


def _max_step(path: Path) -> int:
    steps = [int(r["step"]) for r in read_metrics(path)
             if isinstance(r, dict) and "step" in r and r.get("split", "train") != "val"]
    return max(steps, default=0)


def check_resume(script: str | os.PathLike, total_steps: int = 60, kill_after: int = 25, every: int = 10) -> None:
    """Upgrade 2: SIGKILL mid-run, ``--resume``: the loss curve equals the uninterrupted run's.

    Runs the script twice side by side with the same seed: one runs to the end, the
    other is killed (SIGKILL: no chance to save) once ``metrics.jsonl`` shows step
    ``kill_after``. ``metrics.jsonl`` is moved aside, then the killed run is resumed:
    the resumed process must start after step 1 and its losses must match the
    uninterrupted run's at the same steps.
    """
    script = _script(script)
    seed = random.randint(1, 9999)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        common = ["--seed", str(seed), "--max-steps", str(total_steps), "--ckpt-every-steps", str(every), *SMALL_RUN]
        ref = _start(script, ["--out", str(tmp / "ref"), *common], tmp / "ref.log")
        victim = _start(script, ["--out", str(tmp / "run"), *common], tmp / "run.log")
        deadline = time.monotonic() + TIMEOUT
        try:
            while victim.poll() is None and _max_step(tmp / "run" / "metrics.jsonl") < kill_after:
                expect(time.monotonic() < deadline, f"{TIMEOUT} s 内 metrics.jsonl 出现 step {kill_after}", "超时")
                time.sleep(0.05)
            expect(victim.poll() is None, f"在 step {kill_after} 之后还能 kill 掉进程",
                   f"进程已自行结束(退出码 {victim.returncode});metrics.jsonl 要边训练边写(至少每次存检查点时 flush)")
            killed_at = _max_step(tmp / "run" / "metrics.jsonl")
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            victim._log_handle.close()  # type: ignore[attr-defined]
            _finish(ref, tmp / "ref.log", "不中断的参照运行")
        finally:
            for proc in (ref, victim):
                if proc.poll() is None:
                    proc.kill()
        before = read_train_records(tmp / "run")
        os.replace(tmp / "run" / "metrics.jsonl", tmp / "run" / "metrics.before_kill.jsonl")
        _run_all([(script, ["--out", str(tmp / "run"), *common, "--resume"], tmp / "resume.log", "--resume 续训")])
        reference, after = read_train_records(tmp / "ref"), read_train_records(tmp / "run")
        first = min(after)
        expect(first > 1, "--resume 从检查点接着训练(续训进程的第一步 > 1)", "续训进程从 step 1 重新开始")
        expect(first <= killed_at + 1, f"续训从被 kill 前已存的检查点开始(≤ step {killed_at + 1})", f"从 step {first} 开始")
        expect(sorted(after) == list(range(first, total_steps + 1)),
               f"续训进程记录 step {first}..{total_steps},不缺不重", f"steps {sorted(after)[:3]}...{sorted(after)[-3:]}")
        missing = [s for s in range(1, first) if s not in before]
        expect(not missing, f"kill 之前的记录覆盖 step 1..{first - 1}", f"缺少 {missing[:5]}")
        worst_step, worst = max(((s, abs(after[s]["loss"] - reference[s]["loss"])) for s in after),
                                key=lambda t: t[1])
        tol = 1e-3 * max(1.0, abs(reference[worst_step]["loss"]))
        expect(worst <= tol, "续训后的 loss 与不中断的运行逐步一致(曲线无缝衔接)",
               f"step {worst_step}: 续训 {after[worst_step]['loss']:.5f} vs 不中断 {reference[worst_step]['loss']:.5f}"
               "(优化器状态、lr 进度、随机状态或数据顺序没有完整恢复?)")
    passed(f"升级 2: 在 step {killed_at} 被 SIGKILL,--resume 从 step {first} 接上,"
           f"之后 {total_steps - first + 1} 步的 loss 与不中断的运行一致(最大差 {worst:.1e})")


def check_overfit(healthy: str | os.PathLike, broken: str | os.PathLike, steps: int = 150) -> None:
    """Upgrade 4: ``debug_overfit.py`` memorises one batch (exit 0); the label-broken twin cannot (exit != 0)."""
    healthy, broken = _script(healthy), _script(broken)
    seed = random.randint(1, 9999)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        args = ["--steps", str(steps), "--batch-size", "32", "--model", "tiny", "--seed", str(seed)]
        jobs = [(healthy, ["--out", str(tmp / "ok"), *args], tmp / "ok.log", healthy.name),
                (broken, ["--out", str(tmp / "bad"), *args], tmp / "bad.log", broken.name)]
        rc_ok, rc_bad = _run_all(jobs, expect_ok=False)
        ok_log = (tmp / "ok.log").read_text(encoding="utf-8", errors="replace")
        bad_log = (tmp / "bad.log").read_text(encoding="utf-8", errors="replace")
        expect("Traceback" not in ok_log, f"{healthy.name} 不崩溃", ok_log.strip().splitlines()[-1:] or "无输出")
        expect("Traceback" not in bad_log, f"{broken.name} 报告失败而不是崩溃", bad_log.strip().splitlines()[-1:] or "无输出")
        ok, bad = read_train_records(tmp / "ok"), read_train_records(tmp / "bad")
        expect(len(ok) == steps and len(bad) == steps, f"两个脚本各记录 {steps} 步(--steps {steps})",
               f"{len(ok)} 和 {len(bad)} 步")
        first_ok, last_ok = ok[min(ok)]["loss"], ok[max(ok)]["loss"]
        expect(first_ok > 1.0, "健康脚本从接近 ln(10)≈2.3 的初始 loss 开始", f"{first_ok:.4f}")
        expect(last_ok < 0.05, f"健康脚本 {steps} 步后 loss ≈ 0(< 0.05)", f"{last_ok:.4f}")
        expect(rc_ok == 0, "健康脚本通过时退出码为 0", f"{rc_ok}")
        last_bad = sum(bad[s]["loss"] for s in sorted(bad)[-5:]) / 5
        expect(last_bad > 0.5, "注入标签错误的脚本 loss 降不下去(> 0.5)", f"{last_bad:.4f}(它把错误也记住了?)")
        expect(rc_bad != 0, "注入标签错误的脚本以非 0 退出码报告失败", f"退出码 {rc_bad}")
        expect(len(bad_log.strip()) > 0, f"{broken.name} 打印一条说明失败的消息", "没有任何输出")
    passed(f"升级 4: 健康脚本 loss {first_ok:.2f} → {last_ok:.4f}(退出码 0);"
           f"注入标签错误的版本停在 {last_bad:.2f}(退出码 {rc_bad})")
