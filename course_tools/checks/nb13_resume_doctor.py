"""Check for notebook 13 (the resume doctor's capstone).

``check_capstone(save_checkpoint, load_checkpoint, seed=1234)`` pastes the learner's exercise cell (the two
functions, their imports and helpers, read back from the source Python keeps of it) over the reference trainer's
two functions (``course_tools.lab.capstone.with_functions``) and runs ``python -m course_utils.resume_doctor`` on
the result: it passes when the doctor finds nothing (exit 0), else it prints the diagnosis and fails naming the
first difference (component and step). One save and one load in this process first catch an unfinished stub or a
crash in a second. Why the doctor decides: its kills count optimizer steps inside the trainer's own process, so
the verdict does not depend on load, and the comparison is exact (a correct resume on a CPU is bit for bit).
``seed`` is the trainer's ``--seed`` (initial weights, token stream, data order). Example::

    check_capstone(save_checkpoint, load_checkpoint)
"""
from __future__ import annotations

import linecache
import tempfile
from pathlib import Path

import torch

from course_tools.checks import call_learner, exercise_check, expect, fail, passed
from course_tools.lab import capstone

__all__ = ["check_capstone", "cell_source", "HINTS"]

# the doctor's component -> what to look at in save/load (the doctor's own block says more)
_WHERE = {
    "weights": "权重没有原样存下(看 save_checkpoint 里的 model.state_dict())",
    "scheduler": "学习率调度器的状态没存或没恢复",
    "data": "数据顺序没有接上:sampler 的 epoch 和位置都要存、都要恢复",
    "rng": "随机数状态没存或没恢复(dropout 用的是 torch 的全局生成器)",
    "optimizer": "优化器状态没存或没恢复",
}


def cell_source(*functions) -> str:
    """The source of the cell(s) that defined ``functions``, each cell once (Jupyter keeps every cell's text
    for tracebacks; so do the tests' ``run_source``); "" when one of them has none."""
    texts: list[str] = []
    for fn in functions:
        code = getattr(fn, "__code__", None)
        lines = linecache.getlines(code.co_filename) if code is not None else []
        if not lines:
            return ""
        text = "".join(lines)
        if text not in texts:
            texts.append(text)
    return "\n\n".join(texts)


def _dry_run(save_checkpoint, load_checkpoint, folder: Path) -> None:
    """One save after three steps and one load into fresh objects, here: a stub or a crash fails in a second."""
    from course_tools.lab import train_tiny_lm as trainer

    model, optimizer, scheduler, sampler, _ = trainer.build(1, capstone.STEPS)
    call_learner(save_checkpoint, folder / "dry.pt", model, optimizer, scheduler, sampler, 3)
    model, optimizer, scheduler, sampler, _ = trainer.build(2, capstone.STEPS)
    step = call_learner(load_checkpoint, folder / "dry.pt", model, optimizer, scheduler, sampler)
    expect(isinstance(step, int) and step == 3, "load_checkpoint 返回检查点里存的 step(这里是 3)", f"{step!r}",
           "训练脚本用这个返回值接着数步数: return 存下的 step")


@exercise_check
def check_capstone(save_checkpoint, load_checkpoint, seed: int = 1234) -> None:
    """Run the resume doctor on the reference trainer with the learner's two functions: it must find nothing."""
    generator = torch.get_rng_state()
    with tempfile.TemporaryDirectory(prefix="capstone-") as tmp:
        folder = Path(tmp)
        try:
            _dry_run(save_checkpoint, load_checkpoint, folder)
        finally:
            torch.set_rng_state(generator)  # the notebook's own random stream is left as it was
        cell = cell_source(save_checkpoint, load_checkpoint)
        expect(bool(cell), "能读到定义这两个函数的格子的源代码", "读不到",
               "在练习格子里用 def 定义 save_checkpoint 和 load_checkpoint,再运行这一格")
        script = capstone.write_trainer(folder / "trainer", capstone.with_functions(cell))
        verdict = capstone.run_doctor(script, folder / "doctor", seed=seed)
    _judge(verdict)


def _judge(verdict: capstone.Verdict) -> None:
    """Pass on exit 0; otherwise show the doctor's block and fail naming its first finding."""
    if verdict.exact:
        passed("体检通过:续训医生在每个中断点杀掉训练、再 --resume,每一步都与不中断的那次完全一致")
        return
    print(verdict.text)
    finding = capstone.first_finding(verdict.report)
    if verdict.returncode != 1 or finding is None:
        fail("训练脚本能自己跑完,续训医生给出结论(退出码 0 或 1)", f"退出码 {verdict.returncode}",
             "上面是医生的输出:先看训练脚本自己的报错(多半是你的函数在脚本里跑不起来)")
    component, what = finding
    fail("续训医生找不到差异(退出码 0)", f"第一处差异在 {what} [{component}]",
         _WHERE.get(component, "读上面医生的诊断:第一处差异和修法都在里面"))


HINTS: dict[str, tuple[str, ...]] = {
    "check_capstone": (
        "续训医生一次只报第一处差异:修好它,再运行检查,下一处才会露出来。学员版脚本里一共有四处",
        "13 的第 2 节「续训医生:一条命令」逐行读了一份诊断:哪一步、哪个部件、证据、怎么修;第 4 节「公开项目里的同类缺陷」说同样的缺陷出现在哪些公开项目里",
        "对照 04 的完整检查点五要素:权重要原样存(不要转半精度),调度器、数据位置(sampler 的 epoch 和位置)、"
        "随机数状态都要存,也都要在 load_checkpoint 里恢复",
    ),
}
