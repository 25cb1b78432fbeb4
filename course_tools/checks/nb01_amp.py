"""Checks for notebook 01 (mixed precision): an AMP train step, and which dtype needs a GradScaler.

``check_amp_train_step(fn, seed)`` runs the learner's step and a reference step side by side on two tiny MLPs on
the CPU with an ENABLED fp16 GradScaler whose scale is controlled (``init_scale=2**10``, ``growth_interval=1``:
every good step doubles it, every inf/NaN step halves it), weights and batches from ``seed``. It compares the
returned pre-clip norm, the weights and the scale after every step; the threshold is small, so clipping fires on
every good step, and one step carries an inf input, which must be skipped. Each typical mistake (clipping before
``unscale_``, no ``scaler.scale``, a forgotten ``update``, ``optimizer.step()`` instead of ``scaler.step``, no
``zero_grad``, the post-clip norm returned, no clipping, no autocast) fails for every seed, with a hint naming it
(the 50-seed sweep). ``check_needs_scaler(fn)`` asks about fp32, bf16, fp16 and fp64 (no randomness).
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from course_tools.checks import CheckFailed, call_learner, exercise_check, expect, fail, passed, seed_cpu

__all__ = ["check_amp_train_step", "check_needs_scaler", "HINTS"]


_INIT_SCALE = 2.0 ** 10
_SCALER_KW = dict(init_scale=_INIT_SCALE, growth_factor=2.0, backoff_factor=0.5, growth_interval=1, enabled=True)
_MAX_NORM = 0.05  # far below every good step's gradient norm: clipping always fires
_INF_STEP = 3     # 0-based index of the step whose input holds an inf


def _reference_step(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                    x: torch.Tensor, y: torch.Tensor, max_norm: float, amp_dtype: torch.dtype) -> float:
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=amp_dtype, enabled=True):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return float(norm)


def _as_float(value: object) -> float:
    if isinstance(value, torch.Tensor):
        expect(value.numel() == 1, "返回一个数(裁剪前的梯度范数)", f"形状为 {tuple(value.shape)} 的张量")
        return float(value.detach().float().cpu())
    if value is None:
        fail("返回裁剪前的梯度范数", "返回了 None", "clip_grad_norm_ 的返回值就是裁剪前的范数,把它 return 出来")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise CheckFailed("返回裁剪前的梯度范数(float 或 0 维张量)", f"{type(value).__name__}") from None


def _norm_hint(norm: float, ref_norm: float, max_norm: float, step: int, scale: float) -> str:
    """Name the likely mistake behind a wrong returned norm."""
    if ref_norm > 0 and math.isclose(norm / ref_norm, scale, rel_tol=0.05):
        return f"约为正确值的 {scale:g} 倍(= 当前 scale):在 unscale_ 之前取了范数 / 裁剪"
    if ref_norm > 0 and math.isclose(ref_norm / max(norm, 1e-30), scale, rel_tol=0.05):
        return f"约为正确值的 1/{scale:g}:反向时没有经过 scaler.scale(loss),unscale_ 又除了一次 scale"
    if math.isclose(norm, max_norm, rel_tol=1e-3):
        return "这是裁剪后的范数(等于 max_norm);应返回 clip_grad_norm_ 的返回值,即裁剪前的范数"
    if step > 0:
        return "第 1 步正确、之后不对:是否忘了 optimizer.zero_grad(),梯度跨步累加了?"
    return "返回 clip_grad_norm_(model.parameters(), max_norm) 的返回值"


def _one_run(fn, seed: int, d_in: int, hidden: int, classes: int, batch: int) -> None:
    seed_cpu(seed)
    ref_model = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    model = copy.deepcopy(ref_model)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.05, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_scaler = torch.amp.GradScaler("cpu", **_SCALER_KW)
    scaler = torch.amp.GradScaler("cpu", **_SCALER_KW)

    seen_dtypes: list[torch.dtype] = []
    model[0].register_forward_hook(lambda mod, inp, out: seen_dtypes.append(out.dtype))

    gen = torch.Generator().manual_seed(seed + 1)
    batches = []
    for i in range(5):
        x = torch.randn(batch, d_in, generator=gen) * 3.0
        if i == _INF_STEP:  # a bad batch: the fp16 step must be skipped and the scale halved
            x[0, 0] = float("inf")
        batches.append((x, torch.randint(0, classes, (batch,), generator=gen)))

    for i, (x, y) in enumerate(batches):
        scale_in_step = ref_scaler.get_scale()
        ref_norm = _reference_step(ref_model, ref_opt, ref_scaler, x, y, _MAX_NORM, torch.float16)
        if math.isfinite(ref_norm) and not ref_norm > 2 * _MAX_NORM:  # the cases must exercise clipping
            raise RuntimeError(f"check case too easy: step {i} norm {ref_norm} vs max_norm {_MAX_NORM}")
        seen_dtypes.clear()
        try:
            out = call_learner(fn, model, opt, scaler, x.clone(), y.clone(), _MAX_NORM, torch.float16)
        except CheckFailed as failed:
            cause = failed.__cause__  # GradScaler's own misuse errors are AssertionErrors
            if isinstance(cause, AssertionError) and not isinstance(cause, CheckFailed):
                raise CheckFailed("函数正常运行", f"GradScaler 报错: {cause}",
                                  "反向要写成 scaler.scale(loss).backward(),之后才能 unscale_ / step"
                                  if "scaler.scale" in str(cause) else failed.hint) from None
            raise
        norm = _as_float(out)
        expect(bool(seen_dtypes) and seen_dtypes[-1] == torch.float16,
               "前向在 torch.autocast(float16) 里运行(Linear 输出 float16)",
               f"Linear 输出 {seen_dtypes[-1] if seen_dtypes else '(前向没有运行)'}",
               "前向要写在 with torch.autocast(device_type=x.device.type, dtype=amp_dtype, enabled=True): 里,"
               "dtype 用参数 amp_dtype")
        if math.isfinite(ref_norm):
            expect(math.isclose(norm, ref_norm, rel_tol=1e-4, abs_tol=1e-6),
                   f"第 {i + 1} 步返回裁剪前、已 unscale 的梯度范数 {ref_norm:.5g}", f"{norm:.5g}",
                   _norm_hint(norm, ref_norm, _MAX_NORM, i, scale_in_step))
        else:
            expect(not math.isfinite(norm), f"第 {i + 1} 步(输入含 inf)返回非有限的范数", f"{norm:.5g}",
                   "返回 clip_grad_norm_ 的返回值,不要自己把 inf 改掉")
        expect(scaler.get_scale() == ref_scaler.get_scale(),
               f"第 {i + 1} 步后 scaler 的 scale 为 {ref_scaler.get_scale():g}", f"{scaler.get_scale():g}",
               "每步结束调用一次 scaler.update():好的一步之后 scale 翻倍,inf 步之后减半")
        for (name, p), p_ref in zip(model.named_parameters(), ref_model.parameters()):
            expect(p.dtype == torch.float32, f"主权重 {name} 保持 float32", f"{p.dtype}",
                   "不要 model.half():autocast 只在算子内部转换,参数留在 fp32")
            expect(bool(torch.isfinite(p).all()), f"第 {i + 1} 步后权重 {name} 全是有限值(inf 步应被跳过)",
                   "出现了 NaN/inf", "用 scaler.step(optimizer) 代替 optimizer.step():它会跳过梯度含 inf/NaN 的一步")
            err = float((p.detach() - p_ref.detach()).abs().max())
            expect(err <= 1e-5 + 1e-4 * float(p_ref.detach().abs().max()),
                   f"第 {i + 1} 步后权重 {name} 与参考实现一致", f"最大差 {err:.3g}",
                   "返回的范数对、权重不对:是否忘了裁剪、在 step 之后才裁剪,或 step 调用了两次?")


@exercise_check
def check_amp_train_step(fn, seed: int = 11) -> None:
    """``fn(model, optimizer, scaler, x, y, max_norm, amp_dtype) -> pre-clip grad norm``.

    Two runs (different shapes), five steps each, all built from ``seed``.
    """
    for offset, shape in ((0, (6, 32, 5, 24)), (12, (10, 16, 3, 40))):
        _one_run(fn, seed + offset, *shape)
    passed("AMP 训练步正确: autocast 前向 → scale 反向 → unscale_ → 裁剪 → step → update,inf 步被跳过")


_NEEDS_SCALER_HINTS = {
    torch.bfloat16: "bf16 和 fp32 一样有 8 位指数,最小正规数相同(约 1.2e-38),比任何真实的梯度都小得多,"
                    "所以不需要损失缩放;它的非正规数到得比 fp32 浅(尾数少),但那一段在 1e-38 以下,训练里碰不到。"
                    "它缺的是精度,精度不靠损失缩放解决",
    torch.float16: "fp16 只有 5 位指数,最小正规数约 6e-5,小梯度会下溢成 0:它需要损失缩放",
    torch.float64: "fp64 的范围比 fp32 还大,不需要缩放",
    torch.float32: "fp32 本身就是参照:不需要缩放",
}


@exercise_check
def check_needs_scaler(fn) -> None:
    """``fn(dtype) -> bool``: True only for formats whose smallest normal number is larger than fp32's."""
    expected = {torch.float32: False, torch.bfloat16: False, torch.float16: True, torch.float64: False}
    answers = {}
    for dtype in expected:
        got = call_learner(fn, dtype)
        expect(isinstance(got, (bool, torch.Tensor)) or got in (0, 1), "返回 True/False", f"{got!r}")
        answers[dtype] = bool(got)
    for dtype, want in expected.items():
        hint = _NEEDS_SCALER_HINTS[dtype]
        if answers[torch.float64] and not answers[torch.float16]:
            hint = "fp64 需要、fp16 不需要:比较方向反了。范围比 fp32 窄的格式才需要损失缩放"
        expect(answers[dtype] == want, f"needs_scaler({dtype}) 为 {want}", f"{answers[dtype]}", hint)
    passed("只有 fp16 需要 GradScaler: 它的 5 位指数装不下小梯度;bf16 的最小正规数和 fp32 相同")


HINTS: dict[str, tuple[str, ...]] = {
    "check_amp_train_step": (
        "AMP 的一步里有两件事要对上:前向在 autocast 里用低精度算;反向得到的梯度被 GradScaler 放大了 scale 倍。"
        "凡是看梯度大小的操作(求范数、裁剪)都要等梯度恢复真实大小之后再做;跳过坏步、调整 scale 都交给 scaler",
        "重读 01 的「真正的 GradScaler:scale → backward → unscale_ → step → update」一小节,按它的顺序排你的每一行;"
        "02 的「fp16 下的顺序:先 unscale_,再裁剪」解释了顺序错了会怎样",
        "最常错的是求范数、裁剪那一行的位置:它要在 unscale_ 之后、scaler 的 step 之前;要返回的是裁剪函数的返回值"
        "(裁剪前的范数),不是 max_norm;再确认每步开头都清空了上一步的梯度",
    ),
    "check_needs_scaler": (
        "损失缩放要解决的是下溢:很小的梯度在这个格式里变成 0。要比的是这个格式的正规数能往下表示到多小,"
        "它由指数位数决定;非正规数还能再往下延伸一段(长短取决于尾数位数),但那一段比真实的梯度小得多。"
        "和 1 附近的精度(eps)无关",
        "01 的「比特解剖:符号位、指数位、尾数位」一节把各格式的指数位数和能表示的最小正数列在了一起",
        "常见的错是比较 eps 或位宽(那是精度和大小),或者把比较方向写反:拿这个格式能表示的最小正规数和 fp32 的比,"
        "比 fp32 的更大才说明它更早下溢",
    ),
}
