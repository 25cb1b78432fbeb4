"""The resume doctor's words: what a finding means and how to fix it, in Chinese or English, and the printed block.

What: :func:`explain` turns a :class:`~course_utils.resume_doctor.compare.Finding` into three sentences
(what differs, what it means, the fix); :func:`render` prints the doctor's one short block.

Why one table: the doctor, the homework checks (``check_resume``, ``check_ema``) and the notebooks name a
cause in the same words, so a learner who met it in one place recognises it in the next.

Pitfall: evidence is shown as measured (indices, lrs, dtypes); a cause the records cannot pin down
says so (``unknown``) rather than guess.

Reference machinery of the resume doctor, which the homework checks share
(``course_tools/checks/homework_resume.py``).

Example::

    what, meaning, fix = explain(finding, "zh")
"""
from __future__ import annotations

import json
from typing import Any

from course_utils.resume_doctor.compare import Finding

__all__ = ["COMPONENTS", "CAUSES", "explain", "render", "headline"]

COMPONENTS = {
    "weights": ("权重(weights)", "weights"), "buffers": ("缓冲区(buffers)", "buffers"),
    "optimizer": ("优化器状态(optimizer state)", "optimizer state"), "step_counter": ("步数计数", "step counter"),
    "ema": ("EMA", "EMA"), "grad_scaler": ("GradScaler", "GradScaler"), "scheduler": ("学习率调度(scheduler)", "lr scheduler"),
    "data": ("数据顺序和位置", "data order and position"), "accumulation": ("梯度累积(gradient accumulation)", "gradient accumulation"),
    "rng": ("随机数状态(RNG state)", "RNG state"), "unknown": ("无法确定", "cannot tell"),
    "crash": ("续训进程出错", "the resumed process failed"), "nondeterministic": ("脚本本身不可复现", "the script is not reproducible"),
}

# cause -> (zh meaning, zh fix, en meaning, en fix)
CAUSES: dict[str, tuple[str, str, str, str]] = {
    "rounded_float16": ("加载后的权重与保存时不同,而且抽样的权重值(前几个参数张量里均匀取的值,个数见证据的 sampled_values)都能用 float16 精确表示,检查点那一步的却不能: "
                        "检查点里的权重多半存成了 fp16(v.half()),加载时被舍入",
                        "按原来的 dtype 保存 model.state_dict(),不要 .half();要省空间就压缩文件,不要降精度",
                        "the loaded weights differ, and the sampled weight values (evenly spaced in the first parameter tensors; evidence: sampled_values) are all exactly representable "
                        "in float16, unlike that step's: the checkpoint most likely stored them as fp16 (v.half())",
                        "save model.state_dict() in its own dtype, never .half()"),
    "rounded_bfloat16": ("加载后的权重与保存时不同,而且抽样的权重值(前几个参数张量里均匀取的值,个数见证据的 sampled_values)都能用 bfloat16 精确表示,检查点那一步的却不能: "
                         "检查点里的权重多半存成了 bf16",
                         "按原来的 dtype 保存权重",
                         "the loaded weights differ, and the sampled weight values (evenly spaced in the first parameter tensors; evidence: sampled_values) are all exactly representable "
                         "in bfloat16, unlike that step's: the checkpoint most likely stored them as bf16",
                         "save the weights in their own dtype"),
    "dtype": ("加载后的权重 dtype 变了", "按原来的 dtype 保存和加载", "the weights' dtype changed on loading",
              "save and load the weights in their own dtype"),
    "weights_differ": ("刚加载完、续训的第一步之前,权重就与检查点那一步的不同: 检查点没有原样保存权重(或加载后又改了它们)",
                       "保存 model.state_dict() 原样、完整;加载后不要再初始化或改动权重",
                       "right after loading, before any resumed step, the weights differ from that step's: not saved exactly",
                       "save model.state_dict() as it is; do not re-initialise or change the weights after loading"),
    "buffers": ("权重相同,缓冲区(如 BatchNorm 的 running_mean)不同: 检查点漏了它们",
                "保存整个 model.state_dict()(它含缓冲区),不要只存 parameters()",
                "weights equal, buffers (e.g. BatchNorm's running_mean) differ: the checkpoint lacks them",
                "save the whole model.state_dict() (buffers included), not only parameters()"),
    "optimizer_empty": ("续训后的优化器是空的(没有动量): 优化器状态没有存进检查点或没有恢复",
                        "检查点里存 optimizer.state_dict(),续训时 optimizer.load_state_dict(...)",
                        "the resumed optimizer is empty (no moments): its state was not saved or not restored",
                        "save optimizer.state_dict() and load it on resume"),
    "optimizer_differs": ("优化器状态(AdamW 的动量)与检查点那一步的不同", "保存并恢复 optimizer.state_dict(),在同一步保存",
                          "the optimizer state (AdamW's moments) differs from that step's", "save and restore optimizer.state_dict() at the same step"),
    "optimizer_update": ("权重更新不同,优化器状态随之不同", "保存并恢复 optimizer.state_dict()",
                         "the update differs, and so does the optimizer state", "save and restore optimizer.state_dict()"),
    "optimizer_step_count": ("优化器内部的步数(Adam 的 step)与检查点那一步的不同", "恢复 optimizer.state_dict(),不要自己改它的 step",
                             "the optimizer's own step count differs from that step's", "restore optimizer.state_dict() and leave its step alone"),
    "step_repeated": ("续训的第一步用的是检查点那一步自己的 batch: 步数计数少了一,检查点保存的那一步又被训练了一遍",
                 "检查点存“已完成的步数” step,续训从 step + 1 开始(数据位置也从 step 算)",
                 "the first resumed step consumed the checkpoint's own step's batch: the step counter is one short and that step ran twice",
                 "save the number of completed steps and continue at step + 1"),
    "step_skipped": ("续训的第一步用的是下一步的 batch: 步数计数多了一,跳过了一步", "续训从保存的 step + 1 开始,不要再加一",
                "the first resumed step consumed the next step's batch: the step counter is one ahead, a step was skipped",
                "continue at the saved step + 1, no more"),
    "total_steps": ("整条链的优化器步数与不中断的运行不同", "续训后的步数要接着检查点里的 step,到 --max-steps 为止",
                    "the chain made a different number of optimizer steps than the uninterrupted run",
                    "continue counting from the checkpoint's step up to the limit"),
    "too_many_steps": ("续训后做的优化器步比不中断的运行多", "步数接着检查点里的 step 数,总步数到上限就停",
                       "the resumed run made more optimizer steps than the uninterrupted run", "count on from the checkpoint's step and stop at the limit"),
    "restarted": ("续训后的数据从头开始(与第 1 步的 batch 相同): 数据位置没有恢复", "数据顺序只取决于 (seed, epoch),续训时从 epoch 中间接着取(跳过已训练的 batch)",
                  "after the resume the data starts again from the very beginning (step 1's batch): the data position was not restored",
                  "make the order depend on (seed, epoch) only and skip the batches already trained"),
    "replayed_epoch": ("续训后的 batch 是更早一个 epoch 的顺序: epoch 的打乱顺序(sampler 的 epoch 或生成器)没有恢复",
                       "恢复 epoch 计数,每个 epoch 前 sampler.set_epoch(epoch);或用只取决于 (seed, epoch) 的顺序",
                       "the resumed batches follow an earlier epoch's order: the epoch's permutation (the sampler's epoch, its generator) was not restored",
                       "restore the epoch and call sampler.set_epoch(epoch) before each epoch"),
    "replayed": ("续训后重复了已经训练过的 batch: 数据游标退回去了", "保存数据位置(epoch, 已取的 batch 数)并从那里接着取",
                 "the resumed run replays batches already trained: the data cursor went back", "save (epoch, batches taken) and continue from there"),
    "next_epoch_order": ("续训后这个 epoch 剩下的 batch 用的是下一个 epoch 的顺序: 保存时的打乱生成器已经为本 epoch 抽过排列,"
                         "恢复它就得到下一个 epoch 的排列(同一个排列会出现两次)",
                         "顺序只取决于 (seed, epoch);或保存 epoch 开始时的生成器状态,而不是保存时的",
                         "the rest of the resumed epoch follows the next epoch's order: the shuffle generator saved mid-epoch had "
                         "already drawn this epoch's permutation", "derive the order from (seed, epoch), or save the generator "
                         "state from the epoch's start"),
    "skipped_epoch": ("续训后跳过了整整一个 epoch", "检查点存当前 epoch 和其中已取的 batch 数;在 epoch 结尾保存时不要把 epoch 加两次",
                      "the resumed run skipped a whole epoch", "store the current epoch and the batches taken; do not count the epoch twice at an epoch end"),
    "skipped": ("续训后跳过了还没训练的 batch", "保存数据位置(epoch, 已取的 batch 数)并从那里接着取",
                "the resumed run skipped batches not trained yet", "save (epoch, batches taken) and continue from there"),
    "order": ("权重相同,batch 不同,样本编号也不同: 数据顺序(epoch 的打乱顺序或游标)没有恢复",
              "顺序只取决于 (seed, epoch)(make_loader(ds, bs, seed=seed, epoch=epoch, start_batch=k)),或保存并恢复 DataLoader 的状态",
              "weights equal, the batch and its sample indices differ: the data order (the epoch's permutation or the cursor) was not restored",
              "make the order depend on (seed, epoch) only and skip to the batch, or save and restore the loader's state"),
    "augmentation": ("样本编号相同,batch 的内容不同: 数据增强的随机数(数据集变换用的 RNG)没有恢复",
                     "数据增强的随机性由 (seed, epoch, 样本编号) 决定,或者保存并恢复它用的 RNG",
                     "same sample indices, different batch content: the augmentation's randomness was not restored",
                     "derive augmentation randomness from (seed, epoch, index), or save its RNG"),
    "window_split": ("续训后的第一步的梯度累积窗口与不中断的运行不同: kill 把一个累积窗口切开了,窗口里已经累积的 micro-batch 丢了",
                     "只在窗口边界(优化器步之后)保存检查点,续训时窗口计数从保存的位置算",
                     "the first resumed step's accumulation window differs: the kill split a window and the micro-batches accumulated in it were lost",
                     "save only at window boundaries (after an optimizer step) and count the window from the saved position"),
    "lr_restarted": ("续训后的学习率回到了第 1 步的值: 学习率调度(scheduler)从头开始了,它的状态没有存进检查点",
                     "检查点存 scheduler.state_dict(),续训时恢复(或由保存的 step 算出 lr)",
                     "after the resume the lr is back at step 1's value: the scheduler restarted, its state was not saved",
                     "save scheduler.state_dict() and restore it (or compute the lr from the saved step)"),
    "lr_differs": ("权重和 batch 都相同,学习率不同: 学习率调度(scheduler)没有恢复到检查点那一步",
                   "检查点存 scheduler.state_dict(),续训时恢复",
                   "weights and batch equal, the lr differs: the scheduler was not restored to the checkpoint's step",
                   "save scheduler.state_dict() and restore it"),
    "rng_not_restored": ("权重和 batch 都相同,前向的输出却不同: 随机数状态没有恢复(dropout 的掩码变了)",
                         "检查点存 torch、numpy、python 的 RNG 状态,续训加载它们,之后不要再调用 set_seed",
                         "weights and batch equal, the forward's output differs: the RNG state was not restored (other dropout masks)",
                         "save the torch, numpy and python RNG states, restore them, and do not seed again after that"),
    "drawn_between_save_and_resume": ("权重和 batch 都相同,前向的输出不同;不中断的运行在保存检查点之后、下一步之前又从全局随机数生成器取过数"
                                      "(证据里的那个 DataLoader,通常是评估: 普通的 DataLoader 每次 iter() 都从全局生成器取一个种子,"
                                      "shuffle=False 也一样): 检查点里的 RNG 状态已经不是下一步用的那个",
                                      "评估的 DataLoader 用自己的 generator(它不再从全局生成器取种子),或者评估完再保存检查点",
                                      "weights and batch equal, the output differs; between the save and the next step the uninterrupted run drew "
                                      "from the global generator (the loader named in the evidence, usually an evaluation)",
                                      "give the evaluation's DataLoader its own generator, or save after the evaluation"),
    "loader_drew_more": ("权重和 batch 都相同,前向的输出不同: 续训的进程恢复了检查点里的 RNG 状态,但在这一步之前,它的 DataLoader "
                         "从全局随机数生成器取种子的次数比不中断的运行多(证据: draws 对 reference_draws)。没有自己 generator 的 DataLoader "
                         "每建一个迭代器就取一个种子(persistent_workers=True 且 num_workers>0 时只在第一次 iter() 建);从恢复的 RNG "
                         "状态算起,续训的进程取得更多: 例如它在恢复之后重建了不中断的运行在保存之前就建好的迭代器(epoch 中途续训),"
                         "或 StatefulDataLoader 读回 epoch 结尾保存的状态后,第一次 iter() 建两个",
                         "给 DataLoader 和它的 sampler 各一个自己的 generator(sampler=RandomSampler(ds, generator=g1), "
                         "generator=g2),它就不再从全局生成器取种子",
                         "weights and batch equal, the output differs: the resumed process restored the RNG state, but before this step "
                         "its DataLoader drew a seed from the global generator more often than the uninterrupted run (evidence: draws "
                         "against reference_draws). A DataLoader without a generator draws one per iterator it builds (persistent "
                         "workers: only on the first iter()); counted from the restored state, the resumed process drew more: e.g. "
                         "it rebuilt after the restore an iterator the uninterrupted run had built before the save (a mid-epoch "
                         "resume), or a StatefulDataLoader loaded with an epoch-end state built two on its first iter()",
                         "give the DataLoader and its sampler a generator each (sampler=RandomSampler(ds, generator=g1), generator=g2): "
                         "then it draws nothing from the global generator"),
    "ema": ("训练的权重相同,EMA 的权重不同: EMA 没有存进检查点或没有恢复", "检查点存 ema.state_dict()(权重和更新次数),续训时恢复",
            "the trained weights are equal, the EMA's differ: it was not saved or not restored", "save ema.state_dict() and restore it"),
    "ema_update": ("训练的权重相同,这一步之后 EMA 却不同: EMA 的更新次数或 decay 没有恢复", "ema.state_dict() 含更新次数,整份存、整份恢复",
                   "the trained weights are equal, the EMA differs after this step: its update count or decay was not restored",
                   "save and restore the whole ema.state_dict()"),
    "grad_scaler": ("训练的权重相同,GradScaler 的状态不同(证据的 differs 列出不同的项: 缩放系数 scale、自缩放系数上次改变以来"
                    "连续未跳过的步数 _growth_tracker,各为 [续训的, 不中断的]): 它没有存进检查点或没有恢复。fp16 训练里缩放系数决定哪些步因溢出被跳过",
                    "检查点存 scaler.state_dict(),续训时 scaler.load_state_dict(...)",
                    "the trained weights are equal, the GradScaler's state differs (evidence: differs lists the fields, e.g. the scale "
                    "and _growth_tracker, the unskipped steps since the scale last changed, as [resumed, uninterrupted]): it was not saved or not "
                    "restored. In fp16 training the scale decides which steps overflow and are skipped",
                    "save scaler.state_dict() in the checkpoint and scaler.load_state_dict(...) on resume"),
    "update_differs": ("这一步之前记录的一切(权重、优化器状态、batch、lr、前向输出)都相同,更新后的权重却不同: 记录到的信息不足以判断原因",
                       "还没存的状态(梯度裁剪、自定义的计数器)逐一检查",
                       "everything recorded before this step was equal, yet the updated weights differ: the records cannot tell why",
                       "look for state not recorded here (clipping, a counter of your own)"),
    "no_step": ("续训进程没做一个优化器步就结束了", "看日志: 通常是加载检查点出错", "the resumed process ended before its first optimizer step",
                "read its log: usually the checkpoint failed to load"),
    "resumed_crashed": ("续训进程出错退出", "看日志里的报错", "the resumed process exited with an error", "read the error in its log"),
    "initial_weights": ("同一条命令,两次运行的初始权重不同: 脚本本身不可复现,续训无从比较", "建模型之前 set_seed(seed)",
                        "the same command starts from other weights each time: the script is not reproducible", "seed before building the model"),
    "uninterrupted_differs": ("被 kill 之前,同一条命令就与不中断的运行不同: 脚本本身不可复现,续训无从比较",
                              "固定种子、线程数和确定性算法;先让两次不中断的运行逐步一致",
                              "before any kill the same command already differs from the uninterrupted run: the script is not reproducible",
                              "fix seeds, threads and deterministic algorithms first"),
}


def _when(f: Finding, zh: bool) -> str:
    resumed = f.evidence.get("resumed_from_step")
    if f.when == "loaded":
        return (f"step {f.step} 之前(刚加载完 step {resumed} 的检查点)" if zh
                else f"before step {f.step} (right after loading the checkpoint of step {resumed})")
    if f.when == "end":
        return "整条链结束时" if zh else "at the end of the chain"
    return f"step {f.step}"


def explain(f: Finding, lang: str = "zh") -> tuple[str, str, str]:
    """(where and what, what it means, the fix) for one finding."""
    zh = lang == "zh"
    meaning_zh, fix_zh, meaning_en, fix_en = CAUSES.get(f.cause, CAUSES["update_differs"])
    component = COMPONENTS[f.component][0 if zh else 1]
    what = f"{_when(f, zh)}: {component}"
    return what, meaning_zh if zh else meaning_en, fix_zh if zh else fix_en


def headline(f: Finding, lang: str = "zh") -> str:
    """One line for a check's failure message: the cause and its fix."""
    what, meaning, fix = explain(f, lang)
    return f"{what}。{meaning}。修复: {fix}" if lang == "zh" else f"{what}. {meaning}. Fix: {fix}"


def render(report: dict[str, Any], lang: str = "zh") -> str:
    """The doctor's printed block."""
    zh = lang == "zh"
    lines = [("续训医生(resume doctor): " if zh else "resume doctor: ") + {
        "exact": "每次续训都与不中断的运行逐步一致" if zh else "every resume matched the uninterrupted run, step by step",
        "differed": "续训后有差异" if zh else "a resume differed", "error": "无法检查" if zh else "could not check"}[report["verdict"]]]
    for name, chain in report["chains"].items():
        lines.append(f"  {name}: kill {chain['kills']}, " + ("续训自 " if zh else "resumed after ")
                     + (", ".join(f"step {r['resumed_after']}" for r in chain["resumes"]) or "-")
                     + (" ✗" if chain["finding"] else " ✓"))
    first = report.get("first")
    if first:
        lines += [("第一处差异: " if zh else "first difference: ") + f"{first['chain']}, {first['what']}",
                  ("证据: " if zh else "evidence: ") + json.dumps(first["evidence"], ensure_ascii=False)[:400],
                  ("含义: " if zh else "meaning: ") + first["meaning"], ("修复: " if zh else "fix: ") + first["fix"]]
    lines += [("注意: " if zh else "note: ") + note for note in report.get("notes", [])]
    if report.get("error"):
        lines.append(("错误: " if zh else "error: ") + report["error"])
    if report.get("path"):
        lines.append(("报告: " if zh else "report: ") + report["path"])
    return "\n".join(lines)
