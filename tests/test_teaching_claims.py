"""False or misleading sentences that audits found and fixed must not come back (issue 32).

Like ``test_glossary.py`` does for terms, this scans everything a learner reads: the solution notebooks'
cells, the string literals of ``course_tools`` (check messages, hint tiers, quiz data) and ``course_utils``
(module docstrings included), the homework scripts, the README, and the quiz as it is rendered (its
f-strings filled in). Each pattern is a wording that was wrong, with the reason and the fix in a comment.
The numbers behind the fixes are asserted from torch itself below, so the corrected statements stay true.
"""
from __future__ import annotations

import re

import pytest
import torch

from tests.support.texts import learner_texts, squash

# (pattern on whitespace-free text, why it is wrong)
FIXED_CLAIMS = [
    # torch 2.14 has five float8 dtypes and a packed float4; the table shows the two common ones
    (r"(提供|有)的两种fp8|fp8kindstorchhas", "torch 有五种 float8 dtype(外加 float4_e2m1fn_x2),表里只是常用的两种"),
    # bf16's subnormals stop at 2^-133 (~9.2e-41), fp32's at 2^-149 (~1.4e-45): only the smallest NORMAL is shared
    (r"(动态|指数)?范围(与|和|跟)fp32[^。]{0,3}(相同|一样)|范围和fp32一样宽|指数范围相同|动态范围相同"
     r"|(与|和|跟)fp32的(动态|指数)?范围(相同|一样)",
     "bf16 与 fp32 相同的是最大值和最小正规数,最小非正规数不同(1e-42 在 bf16 里变成 0)"),
    (r"范围相同,小梯度不会比fp32更早下溢|而不是尾数位", "下溢到 0 的界(最小非正规数)也取决于尾数位数"),
    (r"smallgradientsdonotunderflow|samerangeasfp32|samedynamicrange", "bf16 shares fp32's smallest normal, not its subnormals"),
    # round-to-nearest: only values below HALF the smallest subnormal become 0 (fp16: 4e-8 -> 5.96e-8)
    (r"比(它|最小非正规数|最小次正规数)还小(,|,)?(就|直接)?变成0|更小的梯度直接变0|below~6e-8become"
     r"|(比|小于|不到)[^。]{0,12}最小(非正规|次正规)?(正)?数[^一半]{0,6}(就|直接)?(被舍入成|变成|舍入为)0",
     "舍入到最近时,比最小非正规数的一半还小才变成 0"),
    # enabled=True is torch's default; the only warning ("CUDA is not available") is avoided by enabled=False
    (r"总是显式传入|避免设备相关的警告|pass``enabled=``explicitly", "enabled=True 是默认值;只有 enabled=False 能避开那条警告"),
    # the README's bf16-without-bf16-instructions range was fp16's numbers (RESULTS §4); 01 measured 0.28x
    (r"0\.07[-–]0\.10", "没有 bf16 指令的 CPU 上 01 实测的是 0.28x,0.07–0.10 是 fp16 的数"),
    # 08b: a stored MFU of ~25% sits near the band the same cell calls normal for large models
    (r"MFU很低", "MFU 的高低要对照同一个峰值说,不能笼统地说很低"),
    # 06: the compute-bound run measured 1.06x with 4 workers on 2 cores (under load): it does not reach the cores
    (r"涨到核数附近就停|核数附近就停", "计算型最多快到大约核数那么多倍,机器忙时可能几乎不涨"),
    # 12: for the bad-data runs the healthy checkpoint is exactly at the bad step: nothing is redone
    (r"往回走了一段", "坏数据的回滚不重算任何一步(restored_step == bad_step)"),
    # 09 / q7: one oversized step can kill every ReLU of a layer (02 §2), after which the grad norm is 0 too
    (r"而不是gradnorm趋0|学习率太大.{0,12}不会让.{0,8}(范数|gradnorm)趋", "学习率太大也能一步推死一层 ReLU,那之前的各层从此拿不到梯度"),
    # 08b: the peak-memory processes run one after the other (the code's own comment), not side by side
    (r"两个进程同时启动", "测内存的两个进程是先后运行的"),
    # nb05 hints: torch.manual_seed seeds every GPU too (torch/random.py); the mistake is a CPU generator object only
    (r"漏了GPU那一行", "torch.manual_seed 已经给所有 GPU 设种子;要提防的是只给 CPU 生成器对象设种子"),
    # nb12 hints: inf compares greater than any finite threshold; only NaN compares False with everything
    (r"NaN/inf和任何数比较都是False", "只有 NaN 和任何数比较都是 False,inf 比任何有限数都大"),
    # 7B full fine-tune: 16 bytes per parameter with the fp32 master weights, not 12 (84 GB)
    (r"每个参数12字节[)）]?(即|=)?84GB|12字节[^。]{0,6}84GB|12B/param|bf16权重和梯度、AdamW两个fp32动量[)）]", "全量微调每个参数 16 字节(含 fp32 主权重),约 112 GB"),
    # issue 50: torch 2.14.1 no longer requires or checks CUBLAS_WORKSPACE_CONFIG (older versions did)
    (r"cuBLAS需要它才能确定|neededbycuBLAS|CUBLAS_WORKSPACE_CONFIG``mustbeset", "CUBLAS_WORKSPACE_CONFIG 只有旧版本的 torch 需要"),
    # issue 50: FlopCounterMode also counts _scaled_mm and the attention kernels; CPU SDPA counts 0
    (r"它只数矩阵乘和卷积|matmulsandconvolutionsonly|onlycountsmatmuls", "FlopCounterMode 按登记表计数,CPU 上的 SDPA 记 0"),
    # issue 50: the fp16 loss overflows when the SUM of the exps does; the forward is inf, not NaN
    (r"logit(第一次)?超过ln\(65504\)|inf/infisNaN|exceedsln\(65504\)=11\.09,and", "溢出的是 exp 之和(ln(65504/C)),前向是 inf 不是 NaN"),
    # issue 50: after one unclipped bad batch the loss stays high for many steps
    (r"下一步loss就回到原来的水平", "不裁剪时坏 batch 之后 loss 居高十几步"),
    # issue 50: on GPUs each rank also selects its device and saves its CUDA RNG state
    (r"要处理的问题和这里完全相同", "GPU 上还要 set_device(LOCAL_RANK) 和每个 rank 的 CUDA 随机数状态"),
    # issue 50: the rounding threshold is half the spacing at w: between eps/4 and eps/2 times |w|
    (r"updatessmallerthan.{0,40}x\|w\|areroundedaway|约eps/2×\|w\|", "界在 eps/4·|w| 和 eps/2·|w| 之间(1.5 + 0.005 在 bf16 里留下)"),
    # issue 50: 11 and 10 took 77 s and 74 s in RESULTS §5
    (r"不到一分钟就能跑完|finishesinunderaminute", "11 和 10 各要 70 多秒(RESULTS §5)"),
    # issue 50: a one-time shuffle of the label list is the fixed misalignment that is memorised
    (r"shuffle\"appliedtothelabellistonly|和`debug_overfit.py`完全相同,只注入", "一次性打乱标签列表是会被背下来的固定错位"),
]


def _quiz_texts() -> dict[str, str]:
    """The quiz as a learner sees it: prompts, choices and explanations with their f-strings filled in."""
    from course_tools.checks.nb09_self_test import QUIZ

    return {f"quiz {q.id}": "\n".join([q.prompt, *q.choices.values(), q.explanation, q.experiment or ""])
            for q in QUIZ.questions}


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    return {where: squash(text) for where, text in {**learner_texts(), **_quiz_texts()}.items()}


def test_the_scan_reads_hints_quiz_readme_and_docstrings(texts):
    assert any(w.startswith("course_tools/checks/nb01_amp.py") for w in texts)
    assert any(w.startswith("course_utils/amp.py") for w in texts) and "README.md" in texts
    assert "quiz q3" in texts and "最小正规数" in texts["quiz q3"]
    assert "fp16只有5位指数,最小正规数约6.1e-05" in texts["quiz q3"]   # the quiz's dtype facts come from torch.finfo


@pytest.mark.parametrize("pattern, why", FIXED_CLAIMS, ids=[why[:24] for _, why in FIXED_CLAIMS])
def test_a_fixed_claim_does_not_come_back(pattern, why, texts):
    found = [(where, m.group(0)) for where, text in texts.items() for m in [re.search(pattern, text)] if m]
    assert not found, f"{why}: {found[:6]}"


def test_q7_offers_no_choice_that_is_also_right():
    # "学习率太大" as a wrong choice of q7 was itself a way to get a zero grad norm (dead ReLUs after one step)
    from course_tools.checks.nb09_self_test import QUIZ

    q7 = QUIZ.by_id["q7"]
    assert "一开始" in q7.prompt and not any("学习率太大" in text for text in q7.choices.values())


def test_the_dtype_facts_behind_the_fixes():
    fp32, bf16, fp16 = (torch.finfo(d) for d in (torch.float32, torch.bfloat16, torch.float16))
    assert bf16.smallest_normal == fp32.smallest_normal                                    # the same smallest normal
    assert bf16.smallest_normal * 2.0 ** -7 == 2.0 ** -133 and fp32.smallest_normal * 2.0 ** -23 == 2.0 ** -149
    assert torch.tensor(1e-42).item() > 0 and torch.tensor(1e-42).to(torch.bfloat16).item() == 0
    sub16 = fp16.smallest_normal * 2.0 ** -10
    assert torch.tensor(4e-8).half().item() == sub16 and torch.tensor(0.49 * sub16).half().item() == 0
    float8 = [n for n in dir(torch) if n.startswith("float8") and isinstance(getattr(torch, n), torch.dtype)]
    assert len(float8) == 5 and isinstance(torch.float4_e2m1fn_x2, torch.dtype)


def test_a_full_fine_tune_budget_counts_the_master_weights():
    from course_utils.estimate import memory_budget

    full = memory_budget(7_000_000_000, "adamw", bytes_per_param=2)
    assert full.total == 16 * 7_000_000_000 and full.master_weights == 4 * 7_000_000_000
    assert memory_budget(1000, "adamw").master_weights == 0          # fp32 weights are their own master copy
    assert 80e9 < full.total - full.master_weights < 80 * 2 ** 30    # without it, "fits in 80 GB" hangs on GB vs GiB
