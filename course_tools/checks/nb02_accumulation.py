"""Check for notebook 02's exercise 3 (gradient accumulation).

``check_accumulated_step(fn, seed)``: ``fn(model, optimizer, micro_batches, max_norm)`` must take the
step one big batch would take (all micro-batches concatenated, cross-entropy averaged over all samples):
zero the stale gradients once, weight each micro-batch's mean loss by its share of the samples, backward
each micro-batch once, clip the accumulated gradient once by its global norm, one ``optimizer.step()``,
and return the window's mean loss. The model is a float64 MLP, so a right answer matches the big-batch
reference to about 1e-15 and every mistake is off by far more than the 1e-9 tolerance. Uneven
micro-batch sizes (mean of means, dividing by K), garbage in ``.grad`` before the call (no zero_grad at
the start), one case where clipping acts and one where it does not (per-micro-batch clipping, no
clipping, a loss scaled by a constant: the clip would hide the scale), SGD with momentum (a step per
micro-batch differs from one step, and is also counted).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from course_tools.checks import CheckFailed, call_learner, exercise_check, expect, fail, passed

__all__ = ["check_accumulated_step", "HINTS"]

# (micro-batch sizes, max_norm as a multiple of the window's gradient norm): clipping acts, then it does not
_CASES = (((5, 2, 3), 0.3), ((4, 1, 6, 3), 10.0))
_LR, _MOMENTUM, _TOL = 0.1, 0.9, 1e-9
_Window = tuple[dict[str, torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]], list[torch.Tensor], float]


_SHAPES = {"0.weight": (12, 6), "0.bias": (12,), "2.weight": (4, 12), "2.bias": (4,)}


def _model(state: dict[str, torch.Tensor]) -> nn.Module:
    """A fresh float64 MLP holding a copy of ``state`` (built on the meta device: no draw from torch's RNG)."""
    model = nn.Sequential(nn.Linear(6, 12, device="meta"), nn.Tanh(), nn.Linear(12, 4, device="meta"))
    model.load_state_dict({k: v.clone() for k, v in state.items()}, assign=True)
    return model


def _stepped(state, parts, stale, weights, max_norm, clip_each=False) -> list[torch.Tensor]:
    """Parameters after one momentum-SGD step from ``stale`` gradients (None: zero), micro-batch i's mean loss
    weighted by ``weights[i]``, clipped once at the end (``max_norm`` None: never; ``clip_each``: after each backward)."""
    model = _model(state)
    opt = torch.optim.SGD(model.parameters(), lr=_LR, momentum=_MOMENTUM)
    for p, g in zip(model.parameters(), stale):
        p.grad = None if g is None else g.clone()
    for (x, y), w in zip(parts, weights):
        (F.cross_entropy(model(x), y) * w).backward()
        if clip_each:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if not clip_each and max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    opt.step()
    return [p.detach().clone() for p in model.parameters()]


@functools.lru_cache(maxsize=8)
def _window(seed: int, case: int) -> _Window:
    """The model's initial state, the micro-batches, the stale gradients and max_norm of one case (cached)."""
    sizes, ratio = _CASES[case]
    gen = torch.Generator().manual_seed(seed * 10 + case)
    state = {k: torch.randn(shape, generator=gen, dtype=torch.float64) for k, shape in _SHAPES.items()}
    parts = [(torch.randn(n, 6, generator=gen, dtype=torch.float64) * 2, torch.randint(0, 4, (n,), generator=gen))
             for n in sizes]
    stale = [torch.randn(shape, generator=gen, dtype=torch.float64) * 50 for shape in _SHAPES.values()]
    model = _model(state)
    for x, y in parts:
        (F.cross_entropy(model(x), y) * len(y) / sum(sizes)).backward()
    norm = float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()])))
    return state, parts, stale, ratio * norm


@functools.lru_cache(maxsize=8)
def _references(seed: int, case: int) -> dict[str, Any]:
    """The right step, the typical mistakes' steps (by hint), the right loss and the wrong losses of one case."""
    state, parts, stale, max_norm = _window(seed, case)
    sizes = [len(y) for _, y in parts]
    total, k = sum(sizes), len(sizes)
    share = [n / total for n in sizes]
    none = [None] * len(stale)
    with torch.no_grad():
        losses = [float(F.cross_entropy(_model(state)(x), y)) for x, y in parts]
    mistakes = {
        "不能在调用前留在 .grad 里的旧梯度上继续累加:窗口开始时先 zero_grad 一次": _stepped(state, parts, stale, share, max_norm),
        "各微批次的平均 loss 直接取平均(或除以 K):大小不同的微批次要按样本数 n_i / N 加权":
            _stepped(state, parts, none, [1 / k] * k, max_norm),
        "各微批次的 loss 直接相加:每个要乘 n_i / N": _stepped(state, parts, none, [1.0] * k, max_norm),
        "没有裁剪:累积完以后用 clip_grad_norm_ 按全局范数裁剪一次": _stepped(state, parts, none, share, None),
        "每次 backward 之后都裁剪了:只在整个窗口累积完以后裁剪一次":
            _stepped(state, parts, none, share, max_norm, clip_each=True),
        "只留下了最后一个微批次的梯度:zero_grad 放到了微批次循环里":
            _stepped(state, parts[-1:], none, share[-1:], max_norm),
    }
    wrong_losses = {losses[-1]: "这是最后一个微批次的 loss", sum(losses) / k: "这是各微批次 loss 的平均;要按样本数加权",
                    sum(losses): "这是各微批次 loss 的和"}
    return {"right": _stepped(state, parts, none, share, max_norm), "mistakes": mistakes,
            "loss": sum(s * v for s, v in zip(share, losses)), "wrong_losses": wrong_losses}


def _run(fn: Callable[..., Any], seed: int, case: int) -> tuple[Any, list[torch.Tensor], int, list[int]]:
    """Call the learner on fresh copies of one case: its return value, the parameters, steps and forward sizes."""
    state, parts, stale, max_norm = _window(seed, case)
    model = _model(state)
    for p, g in zip(model.parameters(), stale):
        p.grad = g.clone()  # stale gradients of an earlier window: the learner must clear them once
    optimizer = torch.optim.SGD(model.parameters(), lr=_LR, momentum=_MOMENTUM)
    steps: list[int] = []
    optimizer.register_step_post_hook(lambda *_: steps.append(1))
    seen: list[int] = []
    model.register_forward_pre_hook(lambda _m, args: seen.append(len(args[0])))
    out = call_learner(fn, model, optimizer, [(x.clone(), y.clone()) for x, y in parts], max_norm)
    return out, [p.detach() for p in model.parameters()], len(steps), seen


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(p, q, rtol=_TOL, atol=_TOL) for p, q in zip(a, b))


def _judge_loss(out: Any, refs: dict[str, Any], sizes: list[int]) -> None:
    try:
        got = float(out)
    except (TypeError, ValueError, RuntimeError):
        raise CheckFailed("返回窗口的平均 loss(float 或 0 维张量)", f"{type(out).__name__}",
                          "函数最后 return 整个窗口所有样本的平均 loss") from None
    want = refs["loss"]
    if not abs(got - want) <= _TOL * max(1.0, abs(want)):
        hint = next((text for value, text in refs["wrong_losses"].items()
                     if abs(value - got) <= _TOL * max(1.0, abs(value))),
                    "把每个微批次的 loss × n_i / N 加起来(用 .item() 取数),返回这个和")
        fail(f"返回窗口的平均 loss {want:.6f}(微批次大小 {sizes})", f"{got:.6f}", hint)


@exercise_check
def check_accumulated_step(fn, seed: int = 1234) -> None:
    """Compare ``fn`` with one big-batch step on two windows of uneven micro-batches built from ``seed``."""
    for case in range(len(_CASES)):
        refs = _references(seed, case)
        sizes = [len(y) for _, y in _window(seed, case)[1]]
        out, params, steps, seen = _run(fn, seed, case)
        expect(out is not None, "返回窗口的平均 loss", "返回了 None", "函数最后 return 整个窗口的平均 loss")
        expect(steps == 1, "整个窗口只调用一次 optimizer.step()", f"调用了 {steps} 次",
               "step 放在微批次循环之后" if steps > 1 else "累积完梯度后要调用 optimizer.step()")
        expect(seen == sizes, f"每个微批次前向一次,大小依次为 {sizes}", f"前向的 batch 大小依次为 {seen}",
               "多做了前向:每个微批次只前向一次,返回的 loss 就用那次前向的值" if len(seen) > len(sizes)
               else "逐个微批次前向、反向;不要把它们拼成一个大 batch(显存放不下的正是那个大 batch)")
        if not _same(params, refs["right"]):
            known = [hint for hint, ref in refs["mistakes"].items() if _same(params, ref)]
            fail(f"与一个大 batch(微批次大小 {sizes})的那一步相同(相对误差 ≤ 1e-9)", "更新后的参数不同",
                 known[0] if known else "窗口开始清一次梯度;每个微批次 loss × n_i / N 再 backward;累积完裁剪一次;step 一次")
        _judge_loss(out, refs, sizes)
    passed(f"梯度累积的一步与一个大 batch 的一步相同(2 个窗口,大小不同的微批次,含需要裁剪的情况;seed={seed})")


HINTS: dict[str, tuple[str, ...]] = {
    "check_accumulated_step": (
        "梯度累积要得到的,是把所有微批次拼成一个大 batch、对全部样本取平均 loss 的那一步:.grad 会把每次 backward 的梯度加起来,"
        "所以每个微批次的 loss 要先乘上它在整个窗口里所占的比例;清梯度、裁剪、step 都是整个窗口一次",
        "02 的「5. 梯度累积(gradient accumulation):小显存凑出大 batch」一节逐条量了常见错误的效果,"
        "表里的 (a)(c)(d),以及 (e) 里“step 放进了微批次循环”那一条,都是这个检查会抓的;它还会抓忘了裁剪和 loss 直接相加",
        "常错的几处:各微批次大小不同,却直接对它们的平均 loss 取平均(或除以 K);zero_grad 放进了循环里,或者窗口开始时忘了清;"
        "裁剪放进了循环里,或者忘了裁剪;step 放进了循环里;返回的是最后一个微批次的 loss",
    ),
}
