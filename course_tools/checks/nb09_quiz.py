"""Checks and the question bank for 09_self_test.ipynb.

``QUIZ`` holds the chapter's self-test (the notebook prints each question and puts an
answer bar under it). The graded part goes through plain code cells:
``check_self_test_answers`` grades the learner's answer dict (the instructor grader runs it
outside the kernel, on the dict literal the function returns), the other two checks test
small functions on inputs drawn from a fixed seed, and name the likely mistake when the
ratio to the right answer gives it away.
"""
from __future__ import annotations

import math
import numbers
import random

from course_tools.checks import call_learner, expect, passed
from course_tools.quiz import Question, Quiz, check
from course_utils.estimate import training_hours

__all__ = ["QUESTIONS", "QUIZ", "GRADED_IDS", "check_self_test_answers", "check_estimate_hours",
           "check_ema_start_weight"]


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
        "B": "bf16 有 8 位指数,动态范围与 fp32 相同,小梯度不会下溢成 0",
        "C": "autocast 在 bf16 下会自动放大 loss",
        "D": "bf16 的梯度总是比 fp16 的大",
    }, answer="B", explanation="fp16 只有 5 位指数,最小次正规数约 6e-8,更小的梯度直接变 0,所以要做损失缩放(loss scaling);"
       "bf16 的最小正规数约 1e-38,和 fp32 一样。(bf16 的尾数反而更少。)", experiment="实验 3: finfo 表和 1e-8 的转换"),
    Question("q4", "GradScaler 在训练步的哪些地方起作用?(多选)", kind="multi", choices={
        "A": "backward 之前: 把 loss 乘上 scale 再反向",
        "B": "前向 autocast 里: 把激活放大",
        "C": "step 之前: 把梯度除回 scale(unscale_),发现 inf/NaN 就跳过这一步",
        "D": "step 之后: update() 根据有没有溢出调整 scale",
        "E": "保存 checkpoint 时: 把权重缩放回来",
    }, answer="ACD", explanation="scale(loss) → backward → unscale_(裁剪要在这之后) → step(有 inf 就跳过) → update;"
       "前向和权重本身都不经过它。", experiment="实验 4: 一步一步看梯度被放大、缩回、跳过"),
    Question("q5", "断点续训只存 model.state_dict() 会怎样?(多选)", kind="multi", choices={
        "A": "AdamW 的一阶/二阶矩从零开始,训练“失忆”",
        "B": "学习率调度从头开始(warmup 重来一遍)",
        "C": "数据顺序和随机数生成器的状态与不中断时不同,结果不可比",
        "D": "权重会丢失",
        "E": "没有任何影响,权重在就行",
    }, answer="ABC", explanation="权重本身没丢,丢的是“训练进度”: 优化器状态、调度器进度、epoch/step、随机数状态。",
       experiment="实验 5: 不中断 / 完整续训 / 只存权重 三条曲线"),
    Question("q6", "单 batch 过拟合,loss 降不到接近 0,说明什么?", choices={
        "A": "模型容量不够,换更大的模型",
        "B": "代码有 bug: 按 标签 → loss → 数据对齐 → 梯度链 的顺序排查",
        "C": "学习率太大,调小即可",
        "D": "数据太少,需要更多数据",
    }, answer="B", explanation="一个 batch 几十个样本,去掉正则和增强后,正常大小的模型都能背下来;背不下来说明喂进去的东西"
       "(比如每一步都在变的标签)或反传的路径不对。反过来不成立: 固定不变的标签错位(错开一位、类别编号映射错)"
       "照样能背到 loss≈0,要靠看样本和标签可信的留出数据上的准确率来发现(07 第 3 节)。",
       experiment="实验 6: 正确标签 / 固定错位 / 每一步重新打乱"),
    Question("q7", "grad norm 趋近 0 而且 loss 不降,可能是哪两种情况?(多选)", kind="multi", choices={
        "A": "梯度链断了(误用 detach / no_grad / 张量转 numpy 再转回)",
        "B": "输出饱和(sigmoid/tanh 在饱和区,导数几乎为 0)",
        "C": "batch size 太大",
        "D": "开了梯度裁剪",
        "E": "学习率太大",
    }, answer="AB", explanation="学习率太小也会让 loss 平,但那时 grad norm 正常——所以 grad norm 正好用来区分两类问题。"
       "裁剪只缩短步长,不会让范数趋 0。", experiment="实验 7: detach、饱和、小学习率三种情况的 grad norm"),
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
]

QUIZ = Quiz(QUESTIONS, title="0.4 训练工程常识 · 自测题", name="QUIZ")
GRADED_IDS = [q.id for q in QUESTIONS if q.kind != "text"]


def check_self_test_answers(answers_fn) -> None:
    """Grade ``answers_fn()`` (a dict {question id: answer}) on every question except the short-answer one.

    The messages never contain an answer: they name the questions that are missing or wrong.
    """
    answers = call_learner(answers_fn)
    expect(isinstance(answers, dict), "返回一个 dict,键是题号 \"q1\"…\"q11\",值是你的答案", type(answers).__name__,
           "把答案写成 return {\"q1\": ..., \"q2\": ..., ...} 这样的 dict 字面量")
    missing = [qid for qid in GRADED_IDS if qid not in answers or answers[qid] is None or answers[qid] is ...
               or (isinstance(answers[qid], str) and not answers[qid].strip())]
    expect(not missing, "每道题都作答", f"未作答 {', '.join(missing)}")
    wrong = [qid for qid in GRADED_IDS if not check(QUIZ.by_id[qid], answers[qid]).correct]
    expect(not wrong, f"{len(GRADED_IDS)} 题全对", f"答错 {', '.join(wrong)}",
           "先跑第二部分里对应题号的实验;实在想不通再用 QUIZ.reveal(\"题号\") 看参考答案")
    passed(f"自测题 {len(GRADED_IDS)} 题全对")


def _reference_hours(num_samples: int, epochs: float, batch_size: int, rate: float, unit: str) -> float:
    return training_hours(num_samples, epochs, batch_size, rate if unit == "steps/s" else rate / batch_size)


def _near(ratio: float, target: float) -> bool:
    return target > 0 and ratio > 0 and abs(math.log(ratio / target)) < 0.02


def _hours_hint(ratio: float, batch: int, unit: str) -> str:
    if unit == "samples/s" and _near(ratio, 1 / batch):
        return "小了 batch 倍: 把 samples/s 当成了 steps/s;先除以 batch_size 换算成 steps/s"
    if unit == "steps/s" and _near(ratio, batch):
        return "大了 batch 倍: 把 steps/s 当成了 samples/s;只有 unit 是 samples/s 时才除以 batch_size"
    if _near(ratio, 3600):
        return "大了 3600 倍: 结果是秒,要换算成小时"
    if _near(ratio, 60):
        return "大了 60 倍: 结果是分钟,要换算成小时"
    return "先把 rate 换算成 steps/s,再算总步数 ÷ steps/s ÷ 3600"


def check_estimate_hours(estimate_hours, seed: int = 20240904) -> None:
    """``estimate_hours(num_samples, epochs, batch_size, rate, unit)`` in hours, unit 'steps/s' or 'samples/s'.

    ``seed`` fixes the four cases (two in each unit).
    """
    rng = random.Random(seed)
    for unit in ("steps/s", "samples/s", "samples/s", "steps/s"):
        n, epochs, batch = rng.randint(2_000, 80_000), rng.choice([1, 2, 3, 5]), rng.choice([4, 16, 32, 128])
        rate = round(rng.uniform(0.2, 40.0), 2)
        want = _reference_hours(n, epochs, batch, rate, unit)
        got = call_learner(estimate_hours, n, epochs, batch, rate, unit)
        number = isinstance(got, numbers.Real) and not isinstance(got, bool)
        expect(number, f"estimate_hours(..., {unit!r}) 返回一个数(小时)", f"{type(got).__name__} {got!r}"[:80],
               "返回计算结果本身,不要返回字符串、元组或 None")
        ok = math.isfinite(float(got)) and math.isclose(float(got), want, rel_tol=1e-6)
        hint = "" if ok or not float(got) > 0 else _hours_hint(float(got) / want, batch, unit)
        expect(ok, f"estimate_hours({n}, {epochs}, {batch}, {rate}, {unit!r}) ≈ {want:.4g} 小时", f"{float(got):.4g}", hint)
    passed("训练时长估算正确,两种吞吐单位都对")


def _ema_hint(got: float, decay: float, steps: int) -> str:
    if math.isclose(got, 1 - decay ** steps, rel_tol=1e-6, abs_tol=1e-12):
        return "这是 EMA 里新权重的占比;题目问的是初始权重还剩多少"
    if math.isclose(got, max(0.0, 1 - steps * (1 - decay)), rel_tol=1e-6, abs_tol=1e-12):
        return "1 − steps×(1−decay) 是线性近似,只在 steps×(1−decay) 很小时才准;每次更新占比是乘以 decay"
    if math.isclose(got, decay ** (steps - 1), rel_tol=1e-6) or math.isclose(got, decay ** (steps + 1), rel_tol=1e-6):
        return "更新次数差了一次"
    return "每次更新,初始权重的占比乘以 decay"


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
        ok = math.isclose(float(got), want, rel_tol=1e-6, abs_tol=1e-12)
        expect(ok, f"ema_start_weight({decay}, {steps}) ≈ {want:.4g}", f"{float(got):.4g}",
               "" if ok else _ema_hint(float(got), decay, steps))
    passed("EMA 里初始权重的占比算对了")
