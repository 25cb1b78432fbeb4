"""Checks and the question bank for 09_self_test.ipynb.

``QUIZ`` holds the chapter's self-test (the notebook prints the questions and puts an
answer bar under each). The graded part goes through plain code cells:
``check_self_test_answers`` grades the learner's answer dict (the instructor grader runs it
outside the kernel, on the dict literal the function returns) and ``check_ema_start_weight``
tests one small function on inputs drawn from a fixed seed, naming the likely mistake when
the value gives it away. Question 6 asks the one troubleshooting order: its choices are
built from ``course_utils.debug.TROUBLESHOOTING`` (the right one and three reorderings a
learner of another order would pick), so they cannot drift from it.
"""
from __future__ import annotations

import math
import numbers
import random

import torch

from course_tools.checks import call_learner, exercise_check, expect, passed
from course_tools.quiz import Question, Quiz
from course_utils.debug import TROUBLESHOOTING, troubleshooting_chain
from course_utils.estimate import training_hours
from course_utils.estimate_ckpt import young_interval

__all__ = ["QUESTIONS", "QUIZ", "GRADED_IDS", "ORDER_CHOICES", "EMA_REL_TOL", "check_self_test_answers",
           "check_ema_start_weight", "HINTS"]


def _moved(order: list[str], item: str, to: int) -> str:
    """``order`` with ``item`` moved to position ``to`` (-1: the end), as an arrow chain."""
    rest = [s for s in order if s != item]
    rest.insert(len(rest) if to == -1 else to, item)
    return " → ".join(rest)


def _swapped(order: list[str], a: str, b: str) -> str:
    out = [b if s == a else a if s == b else s for s in order]
    return " → ".join(out)


_SUSPECTS = [step.suspect for step in TROUBLESHOOTING]
# B is the one order; the others are what a learner of a different order picks
ORDER_CHOICES = {
    "A": _moved(_SUSPECTS, "学习率与饱和", 0),          # tune first, debug later
    "B": troubleshooting_chain(),
    "C": _moved(_SUSPECTS, "精度与学习率", -1),         # NaN last: the overfit order without its first step
    "D": _swapped(_SUSPECTS, "数据对齐", "梯度链"),      # the gradient chain straight after the loss
}
if len(set(ORDER_CHOICES.values())) != 4:
    raise ValueError("question 6 needs four different orders")


# dtype facts of question 3's text, from torch.finfo (the smallest subnormal: the smallest normal over 2^mantissa bits)
_FP32, _BF16, _FP16 = (torch.finfo(d) for d in (torch.float32, torch.bfloat16, torch.float16))
_SUB = {"fp32": _FP32.smallest_normal * 2.0 ** -23, "bf16": _BF16.smallest_normal * 2.0 ** -7,
        "fp16": _FP16.smallest_normal * 2.0 ** -10}

QUESTIONS = [
    Question("q1", "混合精度(AMP)训练时,哪些东西是 fp32,哪些是 bf16?", choices={
        "A": "权重、梯度、激活全部是 bf16,所以显存减半",
        "B": "主权重和优化器状态是 fp32;autocast 里 matmul/conv 的计算和激活是 bf16",
        "C": "主权重是 bf16,只有优化器状态是 fp32",
        "D": "只有 loss 是 fp32,其余一律 bf16",
    }, answer="B", explanation="autocast 只降低“计算现场”的精度: 参数本身(主权重)、梯度和优化器状态都留在 fp32。"
       "哪些算子留在 fp32 因设备而异: CUDA 上 softmax、log_softmax、layer_norm 等在 fp32 名单里;CPU 上它们跟随输入,"
       "喂 bf16 就输出 bf16(01 的逐算子表和实验 1 实测)。所以手写 loss 时先 .float() 再取对数。",
       experiment="实验 1: 看 autocast 里输出、log_softmax、权重、梯度的 dtype"),
    Question("q2", "为什么主权重必须是 fp32?", choices={
        "A": "fp32 运算比 bf16 快",
        "B": "更新量远小于权重时,在低精度里相加会被舍入“吞掉”,权重原地不动",
        "C": "优化器只接受 fp32 张量",
        "D": "fp32 更省显存",
    }, answer="B", explanation="bf16 在 1.0 附近的间隔是 2^-7≈0.0078,小于半个间隔的更新加上去会被舍掉;"
       "累加上千步后 fp32 权重走出很远,bf16 权重纹丝不动。", experiment="实验 2: 同一个小更新累加 1000 次"),
    Question("q3", "为什么 bf16 不需要 GradScaler?", choices={
        "A": "bf16 的尾数位比 fp16 多",
        "B": f"bf16 和 fp32 一样有 8 位指数,最小正规数相同(约 {_BF16.smallest_normal:.1e}),真实的小梯度远在它之上,不会下溢成 0",
        "C": "autocast 在 bf16 下会自动放大 loss",
        "D": "bf16 的梯度总是比 fp16 的大",
    }, answer="B", explanation=f"fp16 只有 5 位指数,最小正规数约 {_FP16.smallest_normal:.1e},非正规数最小约 {_SUB['fp16']:.1e},"
       f"不超过它一半的梯度舍入成 0,所以要做损失缩放(loss scaling);bf16 的最小正规数约 {_BF16.smallest_normal:.1e},和 fp32 一样。"
       f"(bf16 的尾数反而更少,所以它的非正规数只到约 {_SUB['bf16']:.1e},比 fp32 的约 {_SUB['fp32']:.1e} 浅;那比真实的梯度小得多。)",
       experiment="实验 3: finfo 表,1e-8 和 1e-42 的转换"),
    Question("q4", "GradScaler 在训练步的哪些地方起作用?(多选)", kind="multi", choices={
        "A": "backward 之前: 把 loss 乘上 scale 再反向",
        "B": "前向 autocast 里: 把激活放大",
        "C": "step 之前: 把梯度除回 scale(unscale_),发现 inf/NaN 就跳过这一步",
        "D": "step 之后: update() 根据有没有溢出调整 scale",
        "E": "保存 checkpoint 时: 把权重缩放回来",
    }, answer="ACD", explanation="scale(loss) → backward → unscale_(裁剪要在这之后) → step(有 inf 就跳过) → update;"
       "前向和权重本身都不经过它。", experiment="实验 4: 01 §2 里一步一步看梯度被放大、缩回、跳过"),
    Question("q5", "断点续训只存 model.state_dict() 会怎样?(多选)", kind="multi", choices={
        "A": "AdamW 的一阶/二阶矩从零开始,训练“失忆”",
        "B": "学习率调度从头开始(warmup 重来一遍)",
        "C": "数据顺序和随机数生成器的状态与不中断时不同,结果不可比",
        "D": "权重会丢失",
        "E": "没有任何影响,权重在就行",
    }, answer="ABC", explanation="权重本身没丢,丢的是“训练进度”: 优化器状态、调度器进度、epoch/step、随机数状态。",
       experiment="实验 5: 04 §1 的不中断 / 完整续训 / 只存权重 三条曲线"),
    Question("q6", "训练出问题时,本章的标准排查顺序(从上往下查,停在第一条对得上的症状)是哪一个?",
             choices=ORDER_CHOICES, answer="B",
             explanation="NaN/inf 最先查:之后的 loss 和 grad norm 都没有意义;标签和 loss 写法不用训练就能查,"
             "而固定的标签映射错误只有看样本才能发现;数据对齐、梯度链、学习率读同一次单 batch 过拟合的曲线,"
             "先修代码再调参;吞吐最后:慢不等于错。每一步的症状和查法见 07 §2(course_utils.debug.TROUBLESHOOTING;"
             "troubleshooting_text() 随时打印它)。",
             experiment="实验 6: 常见 bug 图鉴的曲线各对应排查顺序的哪一步"),
    Question("q7", "grad norm 从训练一开始就趋近 0,loss 也不降,可能是哪两种情况?(多选)", kind="multi", choices={
        "A": "梯度链断了(误用 detach / no_grad / 张量转 numpy 再转回)",
        "B": "输出饱和(sigmoid/tanh 在饱和区,导数几乎为 0)",
        "C": "batch size 太大",
        "D": "开了梯度裁剪",
        "E": "学习率太小",
    }, answer="AB", explanation="学习率太小也会让 loss 平,但那时 grad norm 正常——所以 grad norm 正好用来区分两类问题。"
       "裁剪只缩短步长,不会让范数趋 0。学习率太大通常让 loss 乱跳或变成 NaN;一步过大的更新也能把一层 ReLU 全部推死"
       "(02 §2),那一层和它前面的各层从此几乎拿不到梯度,但那是在一次尖峰之后,不是从一开始。",
       experiment="实验 7: detach、饱和、小学习率三种情况的 grad norm"),
    Question("q8", "吞吐(samples/s)骤降,但 GPU 利用率很低,先查什么?", choices={
        "A": "换一块更大的 GPU",
        "B": "数据加载: num_workers、磁盘 IO、pin_memory、CPU 上的数据增强",
        "C": "调小学习率",
        "D": "关掉 AMP",
    }, answer="B", explanation="GPU 闲着说明它在等数据;先量每步等数据的时间,再加 worker / 换更快的存储 / 把增强挪到 GPU。",
       experiment="实验 8: 把每步时间拆成“等数据”和“计算”"),
    Question("q9", "clip_grad_norm_(params, max_norm=1.0) 返回了 5.0,这一步发生了什么?", choices={
        "A": "每个梯度元素被截断到 [-1, 1]",
        "B": "所有梯度一起乘以约 0.2,方向不变;5.0 是裁剪前的范数",
        "C": "这一步被跳过了",
        "D": "返回 5.0 说明裁剪失败了",
    }, answer="B", explanation="全局范数裁剪把所有梯度看成一个长向量,整体等比缩小到 max_norm;返回值是裁剪前的范数,"
       "所以日志里看到大于阈值的数是正常的,它正是报警信号。", experiment="实验 9: 裁剪前后的范数与方向"),
    Question("q10", "EMA decay=0.999,从初始权重开始更新 200 步后,初始权重在 EMA 里还占多大比例?(填 0~1 的小数)",
             kind="number", answer=0.999 ** 200, tolerance=0.02,
             explanation="每步初始值的占比乘以 decay: 0.999^200≈0.82。短训练里 EMA 大部分还是初始权重,"
             "所以要么让衰减率渐升(EMA warm-up),要么别在短训练里评估 EMA。", experiment="实验 10: 用 EMA 类实测"),
    Question("q11", "1 万条样本、3 个 epoch、batch 4,实测吞吐 0.5 samples/s(不是 steps/s)。要训练多少小时?",
             kind="number", answer=training_hours(10_000, 3, 4, 0.5 / 4), tolerance=0.02,
             explanation="总样本数 / 每秒样本数 = 30000 / 0.5 s ≈ 16.7 h。若把 0.5 当成 steps/s 代入 "
             "样本数×epoch/(batch×steps/s×3600),得到 4.2 h,少算 4 倍。", experiment="实验 11: estimate_training_time 的两种单位"),
    Question("q12", "简答: 一个完整的 checkpoint 至少要存哪五样东西?", kind="text",
             keywords=(("model", "模型", "权重"), ("opt", "优化器"), ("sched", "调度", "学习率"),
                       ("epoch", "step", "步"), ("rng", "随机", "seed", "种子")),
             explanation="模型权重、优化器状态、学习率调度器状态、epoch/step(以及 epoch 内的位置)、随机数状态;"
             "用了 AMP/EMA 还要存 GradScaler 和 EMA 权重,再加一份配置。"),
    Question("q13", "梯度累积:一个窗口有两个微批次,分别是 7 个和 3 个样本,各自的 loss 是本微批次的平均交叉熵。"
             "怎样才能让累积出的梯度等于 10 个样本一个大 batch 的梯度?", choices={
        "A": "每个微批次的 loss 除以微批次个数 K = 2,再 backward",
        "B": "每个微批次的 loss 乘以它的样本数占比(7/10 和 3/10),再 backward",
        "C": "每个微批次 backward 之前都 zero_grad 一次",
        "D": "什么都不用做,直接 backward 两次,梯度会自动取平均",
    }, answer="B", explanation="大 batch 的平均 loss 等于各微批次平均 loss 按 n_i / N 加权的和。除以 K 只在各微批次一样大时才对:"
       "7+3 时后 3 个样本每个的权重是前 7 个的 7/3 倍;窗口里 zero_grad 只留下最后一个微批次的梯度;"
       "直接 backward 两次得到的是两个平均的和,不是平均(02 §5)。", experiment="实验 12: 7+3 个样本的三种加权"),
    Question("q14", "抢占式实例平均每 3 小时被抢占一次,保存一次检查点要 60 秒,重启要 3 分钟。按 Young 公式,"
             "每做多少分钟的工作存一次检查点?(填分钟数)", kind="number", answer=young_interval(60, 3 * 3600) / 60,
             tolerance=0.02, explanation="τ* = √(2·C·M) = √(2 × 60 s × 10800 s) ≈ 1138 s ≈ 19 分钟。C 和 M 先换成同一个单位"
             "(把 M 写成 180 分钟代入会得到 147,单位还乱了);间隔不是 M 本身;重启成本 R 不改变 τ*,"
             "只让每个间隔的期望时间都乘上 e^{R/M}(08 §7)。", experiment="实验 13: Young 间隔,和 R 的作用"),
]

QUIZ = Quiz(QUESTIONS, title="0.4 训练工程常识 · 自测题", name="QUIZ")
GRADED_IDS = [q.id for q in QUESTIONS if q.kind != "text"]


@exercise_check
def check_self_test_answers(answers_fn) -> None:
    """Grade ``answers_fn()`` (a dict {question id: answer}) on every question except the short-answer one.

    The messages never contain an answer: they name the questions that are missing or wrong. The verdicts of
    the answered questions go into the progress ledger under the quiz's title, like the answer bars' 检查.
    """
    answers = call_learner(answers_fn)
    expect(isinstance(answers, dict), "返回一个 dict,键是题号 \"q1\"…\"q11\"、\"q13\" 和 \"q14\",值是你的答案", type(answers).__name__,
           "把答案写成 return {\"q1\": ..., \"q2\": ..., ...} 这样的 dict 字面量")
    missing = [qid for qid in GRADED_IDS if qid not in answers or answers[qid] is None or answers[qid] is ...
               or (isinstance(answers[qid], str) and not answers[qid].strip())]
    # QUIZ.grade also puts the answered questions' verdicts into the progress ledger: the dashboard's score
    results = QUIZ.grade({qid: answers[qid] for qid in GRADED_IDS if qid not in missing}, verbose=False)
    expect(not missing, "每道题都作答", f"未作答 {', '.join(missing)}")
    wrong = [qid for qid, feedback in results.items() if not feedback.correct]
    expect(not wrong, f"{len(GRADED_IDS)} 题全对", f"答错 {', '.join(wrong)}",
           "先跑第二部分里对应题号的实验;实在想不通再用 QUIZ.reveal(\"题号\") 看参考答案")
    passed(f"自测题 {len(GRADED_IDS)} 题全对")


EMA_REL_TOL = 1e-6   # the tolerance 09's exercise text states


def _apart(want: float, got: float) -> tuple[str, str]:
    """Both numbers with just enough significant digits that they print differently."""
    for digits in range(4, 18):
        shown = f"{want:.{digits}g}", f"{got:.{digits}g}"
        if shown[0] != shown[1]:
            return shown
    return repr(want), repr(got)


def _ema_hint(got: float, decay: float, steps: int) -> str:
    if math.isclose(got, 1 - decay ** steps, rel_tol=1e-6, abs_tol=1e-12):
        return "这是 EMA 里新权重的占比;题目问的是初始权重还剩多少"
    if math.isclose(got, max(0.0, 1 - steps * (1 - decay)), rel_tol=1e-6, abs_tol=1e-12):
        return "1 − steps×(1−decay) 是线性近似,只在 steps×(1−decay) 很小时才准;每次更新占比是乘以 decay"
    if math.isclose(got, decay ** (steps - 1), rel_tol=1e-6) or math.isclose(got, decay ** (steps + 1), rel_tol=1e-6):
        return "更新次数差了一次"
    return "每次更新,初始权重的占比乘以 decay"


@exercise_check
def check_ema_start_weight(ema_start_weight, seed: int = 99) -> None:
    """``ema_start_weight(decay, steps)``: share of the initial weights left in the EMA after ``steps`` updates.

    ``seed`` fixes four of the six cases; the other two are (0.999, 0) and (0.999, 3000).
    """
    rng = random.Random(seed)
    cases = [(0.999, 0), (0.999, 3000)] + [(rng.choice([0.9, 0.99, 0.999, 0.9999]), rng.randint(1, 5000))
                                           for _ in range(4)]
    for decay, steps in cases:
        want = decay ** steps
        got = call_learner(ema_start_weight, decay, steps)
        number = isinstance(got, numbers.Real) and not isinstance(got, bool)
        expect(number, f"ema_start_weight({decay}, {steps}) 返回一个数", f"{type(got).__name__} {got!r}"[:80])
        ok = math.isclose(float(got), want, rel_tol=EMA_REL_TOL, abs_tol=1e-12)
        if not ok:
            shown_want, shown_got = _apart(want, float(got))
            expect(ok, f"ema_start_weight({decay}, {steps}) = {shown_want}(相对误差 ≤ 1e-6)", shown_got,
                   _ema_hint(float(got), decay, steps))
    passed("EMA 里初始权重的占比算对了")


HINTS: dict[str, tuple[str, ...]] = {
    "check_self_test_answers": (
        "这里计分的是你自己对 q1 到 q11、q13 和 q14 的判断:单选写一个字母,多选把选中的字母连成一个字符串,数字题直接写数。"
        "拿不准的题,先想它考的是哪条机制(哪个张量是什么精度、哪一步做了什么),再用实验验证",
        "09 的「第二部分:用实验验证」里每个实验都标了它对应的题号,跑一遍再对照你的选择;"
        "每题考的内容在哪一章学过,见「第一部分:题目」的各个小标题",
        "检查消息只列出答错的题号:一次改一题,改完重新运行检查。常见的失分:多选题少选或多选了一项"
        "(每个选项都单独判断对错);数字题用了近似公式、写成百分数,或者把每秒样本数当成每秒步数换算",
    ),
    "check_ema_start_weight": (
        "EMA 每次更新时,旧的平均(里面包括初始权重的那一份)整体乘上 decay,新权重补上剩下的部分。"
        "所以初始权重的占比每更新一次就缩小一次,而且每次缩小的倍数都一样",
        "09 的「实验 10(第 10 题):EMA 里还剩多少初始权重」用 EMA 类实测了这个占比,可以拿它对照你的函数",
        "常错的三种:用了线性近似 1 − steps×(1−decay)(只在 steps×(1−decay) 很小时才准,检查里有几千步的情形);"
        "算成了新权重的占比;更新次数差了一次(steps 为 0 表示一次都还没更新)",
    ),
}
