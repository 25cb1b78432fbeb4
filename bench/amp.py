"""AMP on this device: fp32 against bf16 and fp16 autocast, and fp16 without a GradScaler.

Table 1 (speed/memory): SmallCNN width 32 (batch 128) and a wider one (width 64, batch 32 by default),
training steps of forward + fp32 loss + backward + AdamW under ``torch.autocast``
(fp16 with a GradScaler). The dtypes alternate inside each repeat; medians are shown.
Memory: on CUDA ``torch.cuda.max_memory_allocated`` per configuration (reset before it).
On CPU there is no allocator peak to ask, so the column is the growth of the process's
resident memory (RSS) from just before the forward pass to just after it, the largest
over the timed steps: the activations kept for backward plus allocator noise. It is a
weak proxy (the allocator reuses and keeps memory); read only large differences.

Table 2 (fp16 without a scaler): the same SmallCNN and batch, loss multiplied by a small
weight (2^-20 by default: an auxiliary loss, or a mean over very many elements, is this
small). Gradients are computed in fp32, in fp16 autocast without a scaler, and in fp16
with a GradScaler; the table shows how many gradient entries are exactly zero, the
relative error against fp32, and how many weights one SGD step (lr = 0.01 / weight, so the
step has a normal size) changes.

    python bench/amp.py                   # CPU here
    python bench/amp.py --device cuda     # on a GPU (bench/gpu_check.sh runs this)
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import format_table, header, machine_info, rss_mb, spread, write_json  # noqa: E402

from course_utils.amp import autocast  # noqa: E402
from course_utils.models import build_model, count_parameters  # noqa: E402

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_supported(device: torch.device, dtype) -> tuple[bool, str]:
    """Try one autocast forward+backward; (ok, reason)."""
    if dtype is None:
        return True, ""
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return False, "bf16 not supported by this GPU"
    try:
        m = torch.nn.Conv2d(3, 4, 3).to(device)
        with torch.autocast(device_type=device.type, dtype=dtype):
            out = m(torch.randn(2, 3, 8, 8, device=device))
        out.float().sum().backward()
        return True, ""
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable here"
        return False, f"{type(exc).__name__}: {str(exc)[:80]}"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Config:
    def __init__(self, name: str, width: int, batch: int, dtype_name: str, device: torch.device) -> None:
        torch.manual_seed(0)
        self.name, self.dtype_name, self.dtype, self.device = name, dtype_name, DTYPES[dtype_name], device
        self.model = build_model("small", width=width).to(device).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.dtype == torch.float16)
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(batch, 3, 32, 32, generator=g).to(device)
        self.y = torch.randint(0, 10, (batch,), generator=g).to(device)
        self.batch = batch
        self.params = count_parameters(self.model)
        self.mem: list[float] = []

    def steps(self, n: int) -> float:
        """Seconds for ``n`` training steps; records the memory measure."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        sync(self.device)
        start = time.perf_counter()
        for _ in range(n):
            before = rss_mb() if self.device.type == "cpu" else 0.0
            with autocast(self.device, self.dtype):
                logits = self.model(self.x)
            if self.device.type == "cpu":
                self.mem.append(rss_mb() - before)
            loss = F.cross_entropy(logits.float(), self.y)
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        sync(self.device)
        elapsed = time.perf_counter() - start
        if self.device.type == "cuda":
            self.mem.append(torch.cuda.max_memory_allocated(self.device) / 2**20)
        return elapsed


def speed_table(device: torch.device, steps: int, repeats: int, models: list[tuple[str, int, int]],
                log=print) -> tuple[list[dict], dict]:
    support = {k: dtype_supported(device, v) for k, v in DTYPES.items()}
    rows = []
    for name, width, batch in models:
        configs = [Config(name, width, batch, k, device) for k in DTYPES if support[k][0]]
        for c in configs:  # warm-up (kernel selection, allocator)
            c.steps(2)
            c.mem.clear()
        times = {c.dtype_name: [] for c in configs}
        for r in range(repeats):
            order = configs if r % 2 == 0 else list(reversed(configs))
            for c in order:
                times[c.dtype_name].append(c.steps(steps))
        fp32 = statistics.median(times["fp32"])
        for c in configs:
            t = times[c.dtype_name]
            sps = [steps * batch / x for x in t]
            rows.append({"model": f"{name} (width {width}, {c.params / 1e6:.2f} M params, batch {batch})",
                         "dtype": c.dtype_name, "samples_per_s": spread(sps),
                         "speedup_vs_fp32": fp32 / statistics.median(t),
                         "mem_mb": max(c.mem) if c.mem else float("nan")})
            log(f"  {name} {c.dtype_name}: {statistics.median(sps):.1f} samples/s")
        for k, (ok, why) in support.items():
            if not ok:
                rows.append({"model": f"{name} (width {width}, batch {batch})", "dtype": k, "unsupported": why})
    return rows, {k: v[1] for k, v in support.items()}


def underflow_table(device: torch.device, weight: float, width: int = 32, batch: int = 128) -> list[dict]:
    """Gradients of ``weight * loss`` in fp32, fp16 without scaler, fp16 with GradScaler."""
    torch.manual_seed(0)
    base = build_model("small", width=width).to(device).train()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(batch, 3, 32, 32, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)

    def grads(mode: str) -> tuple[list[torch.Tensor], float, int]:
        model = copy.deepcopy(base)
        dtype = None if mode == "fp32" else torch.float16
        scaler = torch.amp.GradScaler(device.type, enabled=mode == "fp16 + GradScaler", init_scale=2.0 ** 16)
        opt = torch.optim.SGD(model.parameters(), lr=0.01 / weight)  # a normal-sized step for the weighted loss
        before = [p.detach().clone() for p in model.parameters()]
        with autocast(device, dtype):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y) * weight
        scaler.scale(loss).backward()
        if scaler.is_enabled():
            scaler.unscale_(opt)
        gs = [p.grad.detach().float().clone() for p in model.parameters()]
        scaler.step(opt)
        scaler.update()
        changed = sum(int((p.detach() != b).sum()) for p, b in zip(model.parameters(), before))
        return gs, float(loss.detach()), changed

    ref, ref_loss, ref_changed = grads("fp32")
    flat_ref = torch.cat([r.flatten() for r in ref])
    rows = []
    for mode in ("fp32", "fp16 (no scaler)", "fp16 + GradScaler"):
        if mode != "fp32" and not dtype_supported(device, torch.float16)[0]:
            rows.append({"mode": mode, "unsupported": "fp16 autocast not available"})
            continue
        gs, loss, changed = grads(mode)
        flat = torch.cat([t.flatten() for t in gs])
        nonzero_ref = flat_ref != 0
        rows.append({"mode": mode, "loss": loss,
                     "zero_grads_pct": 100.0 * float(((flat == 0) & nonzero_ref).sum()) / max(1, int(nonzero_ref.sum())),
                     "finite": bool(torch.isfinite(flat).all()),
                     "rel_err": float((flat - flat_ref).norm() / flat_ref.norm()),
                     "weights_changed_pct": 100.0 * changed / flat.numel()})
    return rows


def format_tables(speed_rows: list[dict], under_rows: list[dict], device: torch.device, weight: float) -> str:
    mem_col = "peak MiB (max_memory_allocated)" if device.type == "cuda" else "RSS growth in forward, MiB (weak proxy)"
    t1 = [[r["model"], r["dtype"], "unsupported", "-", r["unsupported"]] if "unsupported" in r else
          [r["model"], r["dtype"], f"{r['samples_per_s']['median']:.1f} ({r['samples_per_s']['min']:.1f}-"
           f"{r['samples_per_s']['max']:.1f})", f"{r['speedup_vs_fp32']:.2f}x", f"{r['mem_mb']:.0f}"]
          for r in speed_rows]
    t2 = [[r["mode"], "unsupported", "-", "-", "-"] if "unsupported" in r else
          [r["mode"], f"{r['zero_grads_pct']:.1f}%", "yes" if r["finite"] else "NO", f"{r['rel_err']:.3g}",
           f"{r['weights_changed_pct']:.1f}%"] for r in under_rows]
    return (format_table(t1, ["model", "autocast", "samples/s (median, min-max)", "vs fp32", mem_col])
            + f"\n\nfp16 without a GradScaler: loss x {weight:.3g}, one SGD step with lr = 0.01 / weight\n"
            + format_table(t2, ["gradients", "zeroed (non-zero in fp32)", "all finite", "rel. error vs fp32",
                                "weights changed"]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=0, help="steps per timing (0: 2 on CPU, 20 on CUDA)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--large-width", type=int, default=64)
    p.add_argument("--large-batch", type=int, default=32)
    p.add_argument("--small-batch", type=int, default=128)
    p.add_argument("--loss-weight", type=float, default=2.0 ** -20)
    p.add_argument("--threads", type=int, default=1, help="torch threads on CPU (0: torch's default)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if args.threads and device.type == "cpu":
        torch.set_num_threads(args.threads)
    steps = args.steps or (20 if device.type == "cuda" else 2)
    info = machine_info(device)
    print(header(info))
    models = [("SmallCNN", 32, args.small_batch), ("wide SmallCNN", args.large_width, args.large_batch)]
    speed_rows, support = speed_table(device, steps, args.repeats, models)
    under_rows = underflow_table(device, args.loss_weight)
    text = (f"{steps} steps per timing x {args.repeats} alternating repeats, device {device}\n\n"
            + format_tables(speed_rows, under_rows, device, args.loss_weight))
    print()
    print(text)
    path = write_json("amp_" + device.type, {"machine": info, "speed": speed_rows, "underflow": under_rows,
                                               "support": support, "table": text}, args.json)
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
