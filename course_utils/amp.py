"""Mixed precision (AMP): which low-precision dtype to use, and a GradScaler only when needed.

bf16 has fp32's 8 exponent bits and the same smallest normal number (~1.2e-38), far
below any real gradient, so no loss scaling is needed (with 7 mantissa bits its
subnormals stop at ~9.2e-41, fp32's at ~1.4e-45: a difference no gradient reaches).
fp16 has 5 exponent bits: its smallest normal is ~6.1e-5, its smallest subnormal
~6e-8, and with round-to-nearest a gradient of at most half of that (~3e-8) becomes zero
unless the loss is scaled up first (GradScaler). The weights and optimizer state
stay fp32 ("master weights"); autocast only lowers the precision of the compute.

Pitfalls: ``enabled=True`` is torch's default, and an enabled ``GradScaler("cuda")``
(or CUDA autocast) on a machine without CUDA warns "CUDA is not available" and
disables itself: pass ``enabled=False`` when no scaling is wanted (``make_grad_scaler``
does); never ``.half()`` the model; call ``scaler.unscale_`` once per step, before
clipping.

Example::

    dtype = autocast_dtype(device, "auto")        # bf16, fp16 or None
    scaler = make_grad_scaler(device, dtype)      # enabled only for fp16
    with autocast(device, dtype):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()

Taught in ``01_amp`` §1–2 (the dtype table, GradScaler), §4 (autocast per op) and §6 (speed and memory; the
master weights and ``.float()`` sections use plain torch).
"""
from __future__ import annotations

import contextlib

import torch

__all__ = ["DTYPES", "autocast_dtype", "needs_grad_scaler", "make_grad_scaler", "autocast", "dtype_table",
           "format_dtype_table"]


DTYPES = {"off": None, "fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(device: torch.device, mode: str = "auto") -> torch.dtype | None:
    """The autocast dtype for ``mode`` ("auto", "bf16", "fp16", "off") on ``device``.

    "auto" picks bf16 on a CUDA GPU that supports it, else fp16 on CUDA, and off
    elsewhere: CPU autocast is numerically fine but usually slower than fp32 unless
    the CPU has bf16 matrix units (ask for "bf16" explicitly to try).
    """
    if mode == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return None
    if mode not in DTYPES:
        raise ValueError(f"amp 只能是 auto/off/bf16/fp16,实际是 {mode!r}")
    return DTYPES[mode]


def needs_grad_scaler(dtype: torch.dtype | None) -> bool:
    """Only fp16 needs loss scaling: its 5 exponent bits underflow small gradients."""
    return dtype == torch.float16


def make_grad_scaler(device: torch.device, dtype: torch.dtype | None) -> torch.amp.GradScaler:
    """A GradScaler that is enabled exactly when ``dtype`` is fp16 (a no-op otherwise)."""
    return torch.amp.GradScaler(device.type, enabled=needs_grad_scaler(dtype))


def autocast(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` for ``dtype``, or a do-nothing context when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=True)


def dtype_table(include_fp8: bool = True) -> list[dict[str, object]]:
    """Bit layout and range of fp32/bf16/fp16 (and the two common fp8 formats, e4m3fn and e5m2), from ``torch.finfo``.

    torch 2.14 has three more float8 dtypes (``float8_e4m3fnuz``, ``float8_e5m2fnuz``, ``float8_e8m0fnu``) and a
    packed ``float4_e2m1fn_x2``; 01 §1 lists them. ``min_subnormal`` is the smallest normal over 2^mantissa bits.
    """
    kinds = [("fp32", torch.float32, 8, 23), ("bf16", torch.bfloat16, 8, 7), ("fp16", torch.float16, 5, 10)]
    if include_fp8:
        for name, attr, exp, man in (("fp8 e4m3", "float8_e4m3fn", 4, 3), ("fp8 e5m2", "float8_e5m2", 5, 2)):
            if hasattr(torch, attr):
                kinds.append((name, getattr(torch, attr), exp, man))
    rows = []
    for name, dtype, exp, man in kinds:
        fi = torch.finfo(dtype)
        rows.append({"dtype": name, "bits": fi.bits, "exponent": exp, "mantissa": man, "max": fi.max,
                     "min_normal": fi.smallest_normal, "min_subnormal": fi.smallest_normal * 2.0 ** -man,
                     "eps": fi.eps})
    return rows


def format_dtype_table(rows: list[dict[str, object]] | None = None) -> str:
    """``dtype_table()`` as aligned text (exact, platform-independent numbers)."""
    rows = rows or dtype_table()
    head = f"{'dtype':<9} {'bits':>4} {'exp':>3} {'man':>3} {'max':>11} {'min normal':>11} {'min subnorm':>11} {'eps':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['dtype']:<9} {r['bits']:>4} {r['exponent']:>3} {r['mantissa']:>3} {r['max']:>11.4g} "
                     f"{r['min_normal']:>11.4g} {r['min_subnormal']:>11.4g} {r['eps']:>10.4g}")
    return "\n".join(lines)
