"""Training-time and cost estimates from measured throughput (do this before renting a GPU).

    total_hours = samples * epochs / (batch_size * steps_per_sec * 3600)

The chapter's example: 10,000 samples, 3 epochs, batch 4, 0.5 steps/s -> ~4.2 h.
Unit trap: the formula wants STEPS per second. If 0.5 is really samples per second
(0.125 steps/s at batch 4), the run takes four times longer, ~16.7 h.

Example::

    tp = measure_throughput(lambda: train_step(next(batches)), batch_size=128, steps=50, warmup=5)
    est = estimate_training_time(50_000, epochs=30, batch_size=128, steps_per_sec=tp.steps_per_sec,
                                 price_per_hour=2.4)
    print(est.summary())

FLOP accounting, MFU and a memory budget (what to predict before the GPU exists)::

    flops = training_flops(model, x)                 # FlopCounterMode: forward + backward of one step
    by_hand = conv_linear_flops(model, x)            # the same from the layer shapes
    ratio = mfu(flops.total * steps_per_sec, matmul_peak_flops())
    budget = memory_budget(count_parameters(model), activations_bytes=saved_activation_bytes(model, x, y))
    counted = measured_memory(model, optimizer, x, y)   # the same four parts, tensor by tensor, after one step

Taught in ``08_time_estimate`` §3 (throughput, hours and cost; §1–2 time the steps by hand first) and §5 (the
unit trap), and ``08b_flops_memory`` §0–4 (FLOPs, MFU, memory; the check of §6's exercise measures with
``measured_memory``).
"""
from __future__ import annotations

import copy
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["Throughput", "measure_throughput", "training_hours", "Estimate", "estimate_training_time",
           "StepFlops", "training_flops", "conv_linear_flops", "matmul_peak_flops", "mfu", "mfu_inputs", "profile_once",
           "MemoryBudget", "memory_budget", "saved_activation_bytes", "measured_memory"]


@dataclass
class Throughput:
    steps: int
    seconds: float
    batch_size: int

    @property
    def steps_per_sec(self) -> float:
        return self.steps / self.seconds

    @property
    def samples_per_sec(self) -> float:
        return self.steps * self.batch_size / self.seconds


def measure_throughput(step_fn: Callable[[], object], batch_size: int, steps: int = 50, warmup: int = 5,
                       device: torch.device | None = None) -> Throughput:
    """Run ``warmup`` untimed steps, then time ``steps`` steps (synchronising the GPU around them)."""
    sync = (lambda: torch.cuda.synchronize(device)) if device is not None and device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step_fn()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step_fn()
    sync()
    return Throughput(steps=steps, seconds=time.perf_counter() - start, batch_size=batch_size)


def training_hours(num_samples: float, epochs: float, batch_size: int, steps_per_sec: float) -> float:
    """Hours of a run: ``num_samples * epochs / batch_size`` optimizer steps at ``steps_per_sec``.

    The one place the formula is written; everything else (``estimate_training_time``,
    the notebook checks) calls it. ``steps_per_sec`` counts optimizer steps, not samples.
    """
    return num_samples * epochs / (batch_size * steps_per_sec * 3600)


@dataclass
class Estimate:
    total_steps: int
    hours: float
    cost: float | None
    steps_per_sec: float
    note: str = ""

    def summary(self) -> str:
        text = f"{self.total_steps} 步 ÷ {self.steps_per_sec:.4g} 步/秒 ≈ {self.hours:.2f} 小时"
        if self.cost is not None:
            text += f",约 {self.cost:.1f} 元"
        return text + (f"\n{self.note}" if self.note else "")


def estimate_training_time(num_samples: int, epochs: float, batch_size: int, *, steps_per_sec: float | None = None,
                           samples_per_sec: float | None = None, price_per_hour: float | None = None,
                           verbose: bool = True) -> Estimate:
    """Hours (and cost) of a run, from a measured throughput given in exactly one unit.

    Pass ``steps_per_sec`` (optimizer steps, each ``batch_size`` samples) or
    ``samples_per_sec``; giving samples/s prints a warning that spells out the unit trap.
    """
    if (steps_per_sec is None) == (samples_per_sec is None):
        raise ValueError("请只给出 steps_per_sec 或 samples_per_sec 其中一个(吞吐单位必须明确)")
    if num_samples <= 0 or epochs <= 0 or batch_size <= 0:
        raise ValueError(f"样本数/epoch/batch 应为正数,实际是 {num_samples}/{epochs}/{batch_size}")
    note = ""
    if samples_per_sec is not None:
        if samples_per_sec <= 0:
            raise ValueError(f"吞吐应为正数,实际是 {samples_per_sec}")
        steps_per_sec = samples_per_sec / batch_size
        wrong_hours = training_hours(num_samples, epochs, batch_size, samples_per_sec)
        note = (f"⚠️ 单位陷阱: 吞吐按 samples/s 给出 ({samples_per_sec:g}),即 {steps_per_sec:.4g} 步/秒。"
                f"若误当成 步/秒 代入公式,会得到 {wrong_hours:.2f} 小时,少算了 {batch_size} 倍。")
        if verbose:
            print(note)
    elif steps_per_sec <= 0:
        raise ValueError(f"吞吐应为正数,实际是 {steps_per_sec}")
    total_steps = -(-int(num_samples * epochs) // batch_size)
    hours = training_hours(num_samples, epochs, batch_size, steps_per_sec)
    cost = hours * price_per_hour if price_per_hour is not None else None
    return Estimate(total_steps=total_steps, hours=hours, cost=cost, steps_per_sec=steps_per_sec, note=note)


@dataclass
class StepFlops:
    """FLOPs of one training step (no optimizer update), split into forward and backward."""
    forward: int
    backward: int

    @property
    def total(self) -> int:
        return self.forward + self.backward


def training_flops(model: nn.Module, example_input: torch.Tensor) -> StepFlops:
    """Forward and backward FLOPs of one step on ``example_input``, counted by ``FlopCounterMode``.

    The loss is cross-entropy against class 0 (its few FLOPs are not counted). FlopCounterMode counts
    only the ops its registry has a formula for (``torch/utils/flop_counter.py``: matmuls, ``_scaled_mm``,
    convolutions, and the flash, efficient and cuDNN attention kernels), a multiply-add as 2 FLOPs;
    everything else counts 0. Pitfall: on the CPU, ``scaled_dot_product_attention``'s default kernel
    is not in that registry and counts 0, forward and backward (08b §1 measures it): add attention's
    ``4·batch·heads·L²·d_head`` forward FLOPs by hand there. Gradients are left in ``.grad``;
    call ``zero_grad`` afterwards if the model is used for training. Taught in 08b §1.
    """
    with FlopCounterMode(display=False) as counter:
        out = model(example_input)
    forward = counter.get_total_flops()
    target = torch.zeros(out.shape[0], dtype=torch.long, device=out.device)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(out, target).backward()
    return StepFlops(forward=forward, backward=counter.get_total_flops())


def conv_linear_flops(model: nn.Module, example_input: torch.Tensor) -> StepFlops:
    """The same count by hand from each Conv2d/Linear layer's shapes (a multiply-add = 2 FLOPs).

    Forward of a layer: ``2 × (outputs) × (inputs each output reads)``, i.e. ``2·N·C_out·H_out·W_out·C_in/groups·k_h·k_w``
    for a convolution and ``2·N·in·out`` for a linear layer; biases, BN, ReLU and pooling are
    neglected. Backward: the weight gradient and the input gradient cost one forward each (2×),
    except for a layer whose input needs no gradient (the first layer: the images) which only
    computes the weight gradient (1×). Taught in 08b §1.
    """
    layers: list[int] = []

    def hook(module: nn.Module, _inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if isinstance(module, nn.Conv2d):
            per_output = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
        else:
            per_output = module.in_features
        layers.append(2 * output.numel() * per_output)

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    try:
        with torch.no_grad():
            model(example_input)
    finally:
        for handle in handles:
            handle.remove()
    # Every layer after the first reads an activation that needs a gradient; the first reads the images.
    first = 2 if example_input.requires_grad else 1
    return StepFlops(forward=sum(layers), backward=sum(layers) * 2 - layers[0] * (2 - first))


def matmul_peak_flops(size: int = 1024, repeats: int = 10, dtype: torch.dtype = torch.float32,
                      device: torch.device | str = "cpu") -> float:
    """Achievable FLOP/s of this CPU (or ``device``): the best of ``repeats`` timed ``size × size`` matmuls (2·size³ FLOPs each).

    Uses torch's current thread count (``torch.get_num_threads()``) on a CPU; one untimed warm-up; on a GPU
    synchronises around each matmul. Draws its matrices from a private generator: the global random stream
    (a run's reproducibility) is left untouched. Taught in 08b §2 (``bench/mfu_check.py`` runs it on the GPU).
    """
    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator).to(device, dtype) for _ in range(2))
    a @ b
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best


def mfu(achieved_flops_per_s: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: the model's FLOPs per second over the hardware's peak. Taught in 08b §2.

    Count the model's FLOPs (forward + backward of the model as written), not what the hardware ran:
    recomputation (activation checkpointing) adds hardware FLOPs (HFU) but not model FLOPs.
    """
    if achieved_flops_per_s < 0 or peak_flops_per_s <= 0:
        raise ValueError(f"FLOP/s 应为正数,实际是 {achieved_flops_per_s} / {peak_flops_per_s}")
    return achieved_flops_per_s / peak_flops_per_s


def mfu_inputs(model: nn.Module, peak_flops: float, processes: int, device: torch.device,
               image: tuple[int, ...] = (3, 32, 32)) -> tuple[float, float | None]:
    """What a training loop needs for its mfu: (forward + backward FLOPs of one ``image``, the peak FLOP/s of all
    ``processes`` together), the peak ``peak_flops`` per process if given, else this CPU's: one thread's
    ``matmul_peak_flops`` (512³, best of 5: ~0.02 s) times the process's threads, else None (a GPU: no mfu without
    its datasheet's number). Pitfall: a matmul timed on several threads of a busy machine waits for whichever
    thread is descheduled: beside 2 CPU hogs on a 2-core AMD EPYC, 2 threads measured 17 GFLOP/s once against
    146 quietly, and a run's mfu came out above 1; one thread times 69-149 there (155 quietly, x 2).

    The FLOPs are counted on a shape-only copy on the meta device: no compute, no RNG draw, no gradients on
    ``model`` (counting on the model itself would run a step the run never asked for). Taught in 08b §2; the
    peak over several sizes is 08b §2's too. Example: ``flops, peak = mfu_inputs(model, 0.0, 1, device)``.
    """
    with torch.device("meta"):
        per_sample = training_flops(copy.deepcopy(model).to("meta"), torch.randn(2, *image)).total / 2
    if peak_flops:
        return per_sample, peak_flops * processes
    if device.type != "cpu":
        return per_sample, None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return per_sample, matmul_peak_flops(size=512, repeats=5) * threads * processes
    finally:
        torch.set_num_threads(threads)


def profile_once(fn: Callable[[], object]) -> torch.profiler.profile:
    """Run ``fn`` once under ``torch.profiler`` (CPU, plus CUDA when available); ``.key_averages()`` is the table.

    The profiler's native log lines ("profiler_start", and "gpuGetDeviceCount failed" on a machine
    without a GPU) go to file descriptor 2, i.e. into the notebook: they are silenced while it runs.
    Taught in 08b §2.
    """
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    sys.stderr.flush()
    stderr = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            with torch.profiler.profile(activities=activities) as prof:
                fn()
    finally:
        os.dup2(stderr, 2)
        os.close(stderr)
    return prof


@dataclass
class MemoryBudget:
    """Bytes of a training step's main memory consumers (see ``memory_budget``)."""
    weights: int
    grads: int
    optimizer_states: int
    activations: int
    master_weights: int = 0   # the fp32 copy mixed precision updates (0 when the weights are fp32 already)

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer_states + self.activations + self.master_weights


_STATES_PER_PARAM = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}


def memory_budget(n_params: int, optimizer: str = "adamw", activations_bytes: int = 0,
                  bytes_per_param: int = 4) -> MemoryBudget:
    """Weights + gradients (``bytes_per_param`` each) + fp32 optimizer states + activations, and the fp32
    master weights when the weights are stored in fewer than 4 bytes. Taught in 08b §3–4.

    AdamW keeps two fp32 moments per parameter (``exp_avg``, ``exp_avg_sq``); SGD with momentum one;
    plain SGD none. ``activations_bytes`` is what autograd saves for backward (01's saved-tensor hook).
    With ``bytes_per_param=2`` (bf16/fp16 weights and gradients) the optimizer updates an fp32 master copy
    (01 §3), 4 more bytes per parameter: a full AdamW fine-tune then needs 2 + 2 + 8 + 4 = 16 bytes per parameter.
    """
    if optimizer not in _STATES_PER_PARAM:
        raise ValueError(f"未知优化器 {optimizer!r};可选: {', '.join(_STATES_PER_PARAM)}")
    return MemoryBudget(weights=n_params * bytes_per_param, grads=n_params * bytes_per_param,
                        optimizer_states=n_params * 4 * _STATES_PER_PARAM[optimizer],
                        activations=activations_bytes, master_weights=n_params * 4 if bytes_per_param < 4 else 0)


def saved_activation_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes autograd saves for backward in one forward + cross-entropy on ``(x, y)`` (01's saved-tensor hook).

    Each storage counts once; the input and the parameters (in memory anyway) are left out. No backward
    is run: the graph is dropped on return. Taught in 08b §3.
    """
    own = {t.untyped_storage().data_ptr() for t in [x, *model.parameters()]}
    held: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in own:
            held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.cross_entropy(model(x), y)
    return sum(held.values())


def measured_memory(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                    y: torch.Tensor) -> MemoryBudget:
    """The four parts of ``memory_budget`` counted on the real tensors after one training step on ``(x, y)``.

    Weights and ``.grad`` from the parameters, optimizer states from ``optimizer.state`` (0-dim ``step``
    counters left out), activations from ``saved_activation_bytes``. Their sum is the floor of the
    step's peak: temporaries, allocator caches and library workspaces come on top. Taught in 08b §3
    (the check of §6's exercise measures with it).
    """
    activations = saved_activation_bytes(model, x, y)
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()

    def nbytes(tensors: list[torch.Tensor]) -> int:
        return sum(t.untyped_storage().nbytes() for t in tensors)

    params = list(model.parameters())
    states = [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor) and t.dim()]
    return MemoryBudget(weights=nbytes(params), grads=nbytes([p.grad for p in params if p.grad is not None]),
                        optimizer_states=nbytes(states), activations=activations)
