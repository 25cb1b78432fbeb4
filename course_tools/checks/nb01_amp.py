"""Checks for notebook 01 (mixed precision): an AMP train step, and which dtype needs a GradScaler.

``check_amp_train_step`` runs the learner's step and a reference step side by side on
a tiny MLP on the CPU, with an ENABLED fp16 GradScaler whose scale is controlled
(``init_scale=2**10``, ``growth_interval=1``: every good step doubles it, every
inf/NaN step halves it). It compares the returned pre-clip norm, the weights and
the scale after every step, and one step carries an inf input, which must be skipped.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from course_tools.checks import call_learner, expect, passed

__all__ = ["check_amp_train_step", "check_needs_scaler"]


_SCALER_KW = dict(init_scale=2.0 ** 10, growth_factor=2.0, backoff_factor=0.5, growth_interval=1, enabled=True)


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


def _as_float(value) -> float:
    if isinstance(value, torch.Tensor):
        expect(value.numel() == 1, "返回一个数(裁剪前的梯度范数)", f"形状为 {tuple(value.shape)} 的张量")
        return float(value.detach().float().cpu())
    try:
        return float(value)
    except (TypeError, ValueError):
        raise AssertionError(f"期望 返回裁剪前的梯度范数(float 或 0 维张量);实际 {type(value).__name__}") from None


def _one_run(fn, seed: int, d_in: int, hidden: int, classes: int, batch: int) -> None:
    torch.manual_seed(seed)
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
        if i == 3:  # a bad batch: the fp16 step must be skipped and the scale halved
            x[0, 0] = float("inf")
        batches.append((x, torch.randint(0, classes, (batch,), generator=gen)))
    max_norm = 0.25  # small: clipping fires on the good steps

    for i, (x, y) in enumerate(batches):
        ref_norm = _reference_step(ref_model, ref_opt, ref_scaler, x, y, max_norm, torch.float16)
        seen_dtypes.clear()
        norm = _as_float(call_learner(fn, model, opt, scaler, x.clone(), y.clone(), max_norm, torch.float16))
        expect(bool(seen_dtypes) and seen_dtypes[-1] == torch.float16,
               "前向在 torch.autocast(float16) 里运行(Linear 输出 float16)",
               f"Linear 输出 {seen_dtypes[-1] if seen_dtypes else '(前向没有运行)'}")
        if math.isfinite(ref_norm):
            expect(math.isclose(norm, ref_norm, rel_tol=1e-4, abs_tol=1e-6),
                   f"第 {i + 1} 步返回裁剪前、已 unscale 的梯度范数 {ref_norm:.5g}",
                   f"{norm:.5g}" + (f"(约为参考的 {norm / ref_norm:.0f} 倍:是否在 unscale_ 之前裁剪/取范数?)"
                                    if ref_norm > 0 and norm / ref_norm > 10 else ""))
        else:
            expect(not math.isfinite(norm), f"第 {i + 1} 步(输入含 inf)返回非有限的范数", f"{norm:.5g}")
        expect(scaler.get_scale() == ref_scaler.get_scale(),
               f"第 {i + 1} 步后 scaler 的 scale 为 {ref_scaler.get_scale():g}",
               f"{scaler.get_scale():g}(每步结束要调用一次 scaler.update())")
        for (name, p), p_ref in zip(model.named_parameters(), ref_model.parameters()):
            expect(bool(torch.isfinite(p).all()), f"第 {i + 1} 步后权重 {name} 全是有限值(inf 步应被跳过)",
                   "出现了 NaN/inf(是否绕过 scaler.step 直接调用了 optimizer.step?)")
            err = float((p.detach() - p_ref.detach()).abs().max())
            expect(err <= 1e-5 + 1e-4 * float(p_ref.detach().abs().max()),
                   f"第 {i + 1} 步后权重 {name} 与参考实现一致", f"最大差 {err:.3g}")
            expect(p.dtype == torch.float32, f"主权重 {name} 保持 float32", f"{p.dtype}")


def check_amp_train_step(fn) -> None:
    """``fn(model, optimizer, scaler, x, y, max_norm, amp_dtype) -> pre-clip grad norm``."""
    for seed, shape in ((11, (6, 32, 5, 24)), (23, (10, 16, 3, 40))):
        _one_run(fn, seed, *shape)
    passed("AMP 训练步正确: autocast 前向 → scale 反向 → unscale_ → 裁剪 → step → update,inf 步被跳过")


def check_needs_scaler(fn) -> None:
    """``fn(dtype) -> bool``: True only for formats whose exponent range is narrower than fp32's."""
    expected = {torch.float32: False, torch.bfloat16: False, torch.float16: True, torch.float64: False}
    for dtype, want in expected.items():
        got = call_learner(fn, dtype)
        expect(isinstance(got, (bool, torch.Tensor)) or got in (0, 1), "返回 True/False", f"{got!r}")
        expect(bool(got) == want, f"needs_scaler({dtype}) 为 {want}", f"{bool(got)}")
    passed("只有 fp16 需要 GradScaler: 它的 5 位指数装不下小梯度;bf16 与 fp32 的指数范围相同")
