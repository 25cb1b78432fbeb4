"""Single-batch overfit test: the first thing to run for any new model, data or loss.

Takes ONE batch from the training data and trains on it again and again. A correct
pipeline drives the loss to ~0 within a few hundred steps; if it does not, the code
has a bug (labels misaligned with inputs, wrong loss, a cut gradient chain, lr far
off), not a capacity problem. Also saves the batch with its labels as a picture:
a consistent wrong label mapping CAN be memorised, so this test cannot catch it;
a look at the samples (or per-class accuracy on the validation set) can.

Writes to --out: metrics.jsonl (step, loss, grad_norm per step) and samples.png.
Exit code 0 when the mean loss of the last 5 steps is below --threshold, 1 otherwise.

    python notebooks/homework/debug_overfit.py --out runs/overfit
    python notebooks/homework/debug_overfit.py --model tiny --steps 150 --batch-size 32
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from course_utils.clipping import global_grad_norm
from course_utils.data import CLASSES, load_cifar10, make_loader
from course_utils.debug import troubleshooting_text
from course_utils.env import pick_device
from course_utils.models import build_model
from course_utils.repro import set_seed

LabelFn = Callable[[torch.Tensor, int], torch.Tensor]


def parse_args(argv: list[str] | None = None, description: str = __doc__) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/debug_overfit", help="folder for metrics.jsonl and samples.png")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--model", choices=["small", "tiny"], default="small")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threshold", type=float, default=0.05, help="final loss that counts as memorised")
    p.add_argument("--device", default="auto")
    return p.parse_args(argv)


def save_samples(x: torch.Tensor, y: torch.Tensor, path: Path, title: str) -> None:
    """The batch's first 8 images with their labels: 30 seconds of looking catches a wrong mapping."""
    import matplotlib
    matplotlib.use("Agg")
    from course_utils.debug import show_samples
    fig = show_samples(x, y, CLASSES, n=8, title=title)
    fig.savefig(path, dpi=80)


def main(argv: list[str] | None = None, label_fn: LabelFn | None = None, name: str = "debug_overfit") -> int:
    """Overfit one batch; ``label_fn(y, step)`` lets a twin script inject label errors."""
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    set_seed(args.seed)
    device = pick_device(args.device)
    data = load_cifar10(train=True, augment=False)
    x, y = next(iter(make_loader(data, args.batch_size, seed=args.seed)))  # one fixed batch, no augmentation
    x, y = x.to(device), y.to(device)
    save_samples(x, y, out / "samples.png", f"{name}: first 8 samples with labels")

    model = build_model(args.model).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    model.train()
    losses = []
    with open(out / "metrics.jsonl", "w", encoding="utf-8") as log:
        for step in range(1, args.steps + 1):
            targets = label_fn(y, step) if label_fn is not None else y
            loss = F.cross_entropy(model(x), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = global_grad_norm(model.parameters())
            optimizer.step()
            losses.append(loss.item())
            log.write(json.dumps({"step": step, "loss": losses[-1], "grad_norm": grad_norm.item()}) + "\n")
            if step % 50 == 0 or step == 1:
                print(f"step {step:4d}  loss {losses[-1]:.4f}  grad_norm {grad_norm.item():.4f}", flush=True)

    final = sum(losses[-5:]) / len(losses[-5:])
    print(f"数据来源: {data.source};batch={args.batch_size},model={args.model},{args.steps} 步")
    if final < args.threshold:
        print(f"✅ 单 batch 过拟合通过: 最后 5 步平均 loss {final:.4f} < {args.threshold}")
        print(f"   别忘了看一眼 {out / 'samples.png'}: 固定的标签映射错误也能被记住,这个测试发现不了,"
              "要靠眼睛(或按类别看验证集准确率)。")
        return 0
    print(f"❌ 单 batch 过拟合失败: 期望最后 5 步平均 loss < {args.threshold};实际 {final:.4f}"
          f"(初始 {losses[0]:.4f})。\n   这是代码 bug 而不是模型容量问题。\n{troubleshooting_text()}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
