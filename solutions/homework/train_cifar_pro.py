"""Professional CIFAR-10 training: the chapter 0.2 script with the chapter 0.4 upgrades.

What it adds to a plain loop, each visible below:
  seeding + config/git dump · AMP (bf16/fp16, GradScaler only for fp16) · global-norm
  clipping with the pre-clip norm logged · EMA weights evaluated next to the raw ones ·
  full checkpoints (atomic, checksummed, last 2 + best) every N steps and every T
  seconds · exact resume after a kill, mid-epoch included · SIGTERM/Ctrl-C saves and
  exits · NaN steps skipped · JSONL/TensorBoard/wandb metrics with spike alerts.

  python solutions/homework/train_cifar_pro.py --out runs/pro --epochs 2
  # kill it any time (even kill -9), then continue exactly where it was:
  python solutions/homework/train_cifar_pro.py --out runs/pro --epochs 2 --resume
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from course_utils.amp import autocast, autocast_dtype, make_grad_scaler
from course_utils.checkpoint import CheckpointManager, StopSignal, restore_training_state, training_state
from course_utils.clipping import ClipResult, clip_gradients
from course_utils.data import batches_per_epoch, load_cifar10, make_loader, take_fraction
from course_utils.ema import EMA
from course_utils.env import pick_device
from course_utils.models import build_model
from course_utils.monitor import Monitor
from course_utils.repro import dump_run_config, set_deterministic, set_seed
from course_utils.schedule import make_scheduler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/pro", help="run folder: config.json, metrics.jsonl, checkpoints/")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many optimizer steps (0: no limit)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", choices=["small", "tiny"], default="small")
    p.add_argument("--width", type=int, default=32, help="channel width of the model")
    p.add_argument("--amp", choices=["auto", "off", "bf16", "fp16"], default="auto",
                   help="auto: bf16 (or fp16) on a CUDA GPU, off on CPU")
    p.add_argument("--clip", type=float, default=1.0, help="max global grad norm (0: measure only)")
    p.add_argument("--ema-decay", type=float, default=0.999, help="0 disables EMA")
    p.add_argument("--ckpt-every-steps", type=int, default=200)
    p.add_argument("--ckpt-every-seconds", type=float, default=3600.0)
    p.add_argument("--keep-last", type=int, default=2)
    p.add_argument("--data-fraction", type=float, default=1.0)
    p.add_argument("--no-augment", action="store_true")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, mps")
    p.add_argument("--logger", action="append", choices=["jsonl", "tensorboard", "wandb"],
                   help="repeatable; jsonl is always on")
    p.add_argument("--log-every", type=int, default=20, help="steps between metric flushes (one host sync each)")
    p.add_argument("--resume", action="store_true", help="continue from the newest valid checkpoint in --out")
    p.add_argument("--deterministic", action="store_true", help="deterministic kernels (slower on GPU)")
    p.add_argument("--max-bad-steps", type=int, default=5, help="stop after this many non-finite steps in a row")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--inject-nan-at-step", type=int, default=0, help=argparse.SUPPRESS)  # for tests and demos
    return p.parse_args(argv)


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader, device: torch.device, dtype) -> tuple[float, float]:
    """(accuracy, mean loss) over ``loader``; restores the model's train/eval mode."""
    was_training = model.training
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, dtype):
            logits = model(x)
        loss_sum += F.cross_entropy(logits.float(), y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
        total += len(y)
    model.train(was_training)
    return correct / total, loss_sum / total


@dataclass
class StepResult:
    """What one optimizer step reports; ``loss`` and ``clip`` stay on the device (no host sync)."""

    loss: torch.Tensor
    clip: ClipResult
    lr: float
    skipped: bool


def train_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, optimizer: torch.optim.Optimizer,
               scheduler, scaler: torch.amp.GradScaler, ema: EMA | None, device: torch.device, amp_dtype,
               clip: float, inject_nan: bool = False, phase: Callable[[str], None] | None = None) -> StepResult:
    """One optimizer step: forward under autocast, fp32 loss, backward, unscale + clip, step or skip.

    A step whose gradients are not finite is skipped: fp16's GradScaler does it itself (and lowers
    its scale); under bf16/fp32 nothing else would notice, so the pre-clip norm is checked here.
    A skipped step advances neither the schedule nor the EMA. ``phase(name)`` is called after each
    part (``bench/overhead.py`` uses it to attribute time); training passes nothing.
    """
    mark = phase or (lambda name: None)
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    with autocast(device, amp_dtype):
        logits = model(x)
    loss = F.cross_entropy(logits.float(), y)  # loss in fp32
    if inject_nan:
        loss = loss * float("nan")
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    mark("forward+backward")
    result = clip_gradients(model.parameters(), clip, scaler=scaler, optimizer=optimizer)
    lr = optimizer.param_groups[0]["lr"]
    mark("clip")
    if scaler.is_enabled():  # fp16: the scaler skips inf/NaN steps and lowers its scale
        scale_before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        skipped = scaler.get_scale() < scale_before
    else:  # bf16/fp32: one host read of the norm's finiteness
        skipped = not result.is_finite()
        mark("isfinite check")
        if not skipped:
            optimizer.step()
    if not skipped:
        scheduler.step()
        mark("optimizer+scheduler")
        if ema is not None:
            ema.update(model)
            mark("ema")
    return StepResult(loss=loss.detach(), clip=result, lr=lr, skipped=skipped)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    device = pick_device(args.device)
    if args.deterministic:  # warn (not fail) on the few CUDA ops that have no deterministic kernel
        set_deterministic(True, warn_only=True)
    set_seed(args.seed)

    # data: the order of every epoch depends only on (seed, epoch), so a resumed run sees the same batches
    train_ds = take_fraction(load_cifar10(True, augment=not args.no_augment, seed=args.seed), args.data_fraction)
    test_ds = take_fraction(load_cifar10(False), args.data_fraction)
    test_loader = make_loader(test_ds, 512, shuffle=False, num_workers=args.workers)
    steps_per_epoch = batches_per_epoch(len(train_ds), args.batch_size, drop_last=True)
    if steps_per_epoch == 0:
        sys.exit(f"训练集只有 {len(train_ds)} 张,不够一个 batch ({args.batch_size});请调小 --batch-size")
    total_steps = args.epochs * steps_per_epoch
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)

    # model, optimizer (fp32 master weights), schedule, AMP, EMA
    model = build_model(args.model, width=args.width).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = make_scheduler(optimizer, args.warmup_steps, total_steps)
    amp_dtype = autocast_dtype(device, args.amp)
    scaler = make_grad_scaler(device, amp_dtype)
    # warm-up: with decay 0.999 a short run would evaluate weights close to the random init
    ema = EMA(model, decay=args.ema_decay, warmup=True) if args.ema_decay > 0 else None
    manager = CheckpointManager(out / "checkpoints", keep_last=args.keep_last,
                                every_steps=args.ckpt_every_steps, every_seconds=args.ckpt_every_seconds)

    step = 0  # optimizer steps done; epoch and position in the epoch follow from it
    found = manager.load_latest(map_location=device) if args.resume else None
    if args.resume and found is None:
        print(f"--resume: {out / 'checkpoints'} 里没有可用的检查点,从头开始")
    if found is None:
        config = dump_run_config(out, vars(args), device, repo=Path(__file__).resolve().parent)
    else:
        path, state = found
        meta = restore_training_state(state, model=model, optimizer=optimizer, scheduler=scheduler,
                                      scaler=scaler, ema=ema)
        step, config = meta["step"], meta["config"]
        print(f"从 {path.name} 续训: step {step}(epoch {step // steps_per_epoch},"
              f"epoch 内第 {step % steps_per_epoch} 个 batch)")
    monitor = Monitor(out, args.logger or ["jsonl"], flush_every=args.log_every, device=device,
                      total_steps=total_steps, resume_step=step if found else None, config=config,
                      progress=not args.no_progress)
    if found is not None:
        monitor.load_state_dict(state["extra"]["monitor"])
    print(f"device={device} amp={amp_dtype or 'off'} steps={total_steps} ({steps_per_epoch}/epoch) "
          f"train={len(train_ds)} test={len(test_ds)} source={train_ds.source}")

    def save(metric: float | None = None) -> None:
        with monitor.paused():
            monitor.flush()  # records up to this step are on disk before the checkpoint that covers them
            manager.save(training_state(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                                        ema=ema, epoch=step // steps_per_epoch, step=step,
                                        batch_in_epoch=step % steps_per_epoch, config=config,
                                        extra={"monitor": monitor.state_dict()}), step, metric)

    def run_eval() -> float:
        with monitor.paused():
            acc, loss = evaluate(model, test_loader, device, amp_dtype)
            metrics = {"acc": acc, "loss": loss}
            if ema is not None:
                metrics["acc_ema"], metrics["loss_ema"] = evaluate(ema.module, test_loader, device, amp_dtype)
            monitor.log_eval(step, (step - 1) // steps_per_epoch, **metrics)
        return metrics.get("acc_ema", acc)

    bad_streak = exit_code = 0
    batches = None
    model.train()
    with StopSignal() as stop:
        while step < total_steps and not stop.requested and not exit_code:
            epoch, position = divmod(step, steps_per_epoch)
            if batches is None or position == 0:  # a new epoch, or the first batch after a resume
                batches = iter(make_loader(train_ds, args.batch_size, seed=args.seed, epoch=epoch,
                                           start_batch=position, num_workers=args.workers, drop_last=True,
                                           pin_memory=device.type == "cuda"))
            x, y = next(batches)
            result = train_step(model, x, y, optimizer=optimizer, scheduler=scheduler, scaler=scaler, ema=ema,
                                device=device, amp_dtype=amp_dtype, clip=args.clip,
                                inject_nan=step + 1 == args.inject_nan_at_step)
            step += 1
            monitor.log_step(step, epoch, result.loss, result.clip.norm, result.clip.clipped, result.lr, len(y),
                             skipped=result.skipped)
            if result.skipped and not scaler.is_enabled():
                monitor.alert("non-finite step", f"step {step}: loss/梯度出现 inf/NaN,已跳过本步(权重未更新)", step)
            bad_streak = bad_streak + 1 if result.skipped else 0
            if bad_streak >= args.max_bad_steps:
                monitor.alert("stopped", f"连续 {bad_streak} 步 inf/NaN,停止训练;磁盘上的检查点仍然有效,"
                              "请降低学习率或检查数据后用 --resume 继续", step)
                exit_code = 2
            elif step % steps_per_epoch == 0:  # end of an epoch: eval, best checkpoint
                save(run_eval())
            elif step == total_steps:  # --max-steps inside an epoch
                run_eval()
                save()
            elif stop.requested or manager.should_save(step):
                save()
        if stop.requested:
            print(f"收到 {stop.requested}: 已在 step {step} 保存检查点,安全退出。用 --resume 继续。")
    monitor.close()
    if exit_code == 0 and not stop.requested:
        print(f"完成: {step} 步,检查点在 {manager.directory}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
