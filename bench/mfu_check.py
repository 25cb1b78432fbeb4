"""The training step's MFU on this device (issue 23; part (e) of bench/gpu_check.sh).

One SmallCNN training step (forward + backward + AdamW), fp32 and (on a GPU) under bf16 autocast: its model FLOPs
counted by ``FlopCounterMode`` (``course_utils.estimate.training_flops``), its steps/s measured with
``measure_throughput`` (synchronised on a GPU), and the matmul peak of the same dtype measured on the
same device (``matmul_peak_flops``). MFU = FLOPs per step × steps/s ÷ that peak: what 08b §2 does on
the CPU, here on the GPU. Compare the measured peak with the datasheet one in 08b §4's table (on a GPU
fp32 matmuls may run on TF32 tensor cores when ``torch.backends.cuda.matmul.allow_tf32`` is set).

    python bench/mfu_check.py --device cuda --json bench/results/mfu_cuda.json
    python bench/mfu_check.py --device cpu --quick          # smoke test
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import format_table, header, machine_info, write_json  # noqa: E402

from course_utils.amp import autocast  # noqa: E402
from course_utils.estimate import matmul_peak_flops, measure_throughput, mfu, training_flops  # noqa: E402
from course_utils.models import build_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    width, batch, steps, size = (8, 16, 3, 256) if args.quick else (64, 256, 50, 8192 if device.type == "cuda" else 1024)

    torch.manual_seed(0)
    model = build_model("small", width=width).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    flops = training_flops(copy.deepcopy(model), x).total   # model FLOPs of one step (the optimizer adds none)

    rows, results = [], {}
    # bf16 on a GPU only: a CPU without bf16 matrix instructions has no meaningful bf16 matmul peak (08b §2)
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16))[:2 if bf16 else 1]:
        def step() -> None:
            with autocast(device, dtype):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        tp = measure_throughput(step, batch_size=batch, steps=steps, warmup=3, device=device)
        peak = matmul_peak_flops(size, repeats=3 if args.quick else 10, dtype=dtype or torch.float32, device=device)
        achieved = flops * tp.steps_per_sec
        results[name] = {"steps_per_sec": tp.steps_per_sec, "achieved_flops": achieved, "peak_flops": peak,
                         "mfu": mfu(achieved, peak)}
        rows.append([name, f"{tp.steps_per_sec:.2f}", f"{achieved / 1e12:.4f}", f"{peak / 1e12:.3f}",
                     f"{mfu(achieved, peak):.1%}"])

    info = machine_info(device)
    print(header(info))
    print(f"SmallCNN(width={width}), batch {batch}, {flops / 1e9:.2f} GFLOP per step (FlopCounterMode), "
          f"{steps} timed steps; peak = best {size}x{size} matmul of the same dtype on {device.type}")
    print(format_table(rows, ["dtype", "steps/s", "achieved TFLOP/s", "matmul peak TFLOP/s", "MFU"]))
    if args.json:
        write_json("mfu", {"info": info, "width": width, "batch": batch, "flops_per_step": flops, "results": results},
                   args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
