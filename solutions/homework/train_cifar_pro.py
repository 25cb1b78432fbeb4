"""Professional CIFAR-10 training: the chapter 0.2 script with the chapter 0.4 upgrades.

What it adds to a plain loop, each visible below:
  seeding + config/git dump · AMP (bf16/fp16, GradScaler only for fp16) · global-norm
  clipping with the pre-clip norm logged · EMA weights evaluated next to the raw ones ·
  full checkpoints (atomic, checksummed) every N steps and every T seconds · exact resume
  after a kill, mid-epoch included · SIGTERM/Ctrl-C saves and exits · NaN steps skipped ·
  JSONL/TensorBoard/wandb metrics with spike alerts.

  python solutions/homework/train_cifar_pro.py --out runs/pro --epochs 2
  # kill it any time (even kill -9), then continue exactly where it was:
  python solutions/homework/train_cifar_pro.py --out runs/pro --epochs 2 --resume

The run folder (--out) holds one run:
  config.json    the run's identity. --resume refuses a command line that would change the
                 trajectory (batch size, seed, data, model...); --lr, --epochs and --max-steps
                 change only with --allow-change FIELD, recorded in config.json's "history".
                 --batch-size is the global batch (the whole job's, however many processes).
  status.json    how the run ended: finished / preempted / stopped_bad_steps / failed
                 (running while it runs). The source of truth, also under launchers that
                 fold exit codes. Exit codes of a plain run: 0 finished, 1 failed,
                 2 refused (bad flag or folder conflict: nothing changed), 3 stopped on
                 bad steps, 75 preempted (saved; run again with --resume).
  checkpoints/   the last 2 step_*.pt (--keep-last) + best.pt + last_good.pt (the newest one
                 saved while training was healthy); the checkpoint a process resumed from is
                 kept too until that process ends. Files a resume will not continue from go to
                 corrupt/ or superseded/, never deleted.
  run.lock       a second run in the same folder is refused (fcntl.lockf).
Starting without --resume in a folder that holds a run is refused; --overwrite starts over
and renames the old run to <out>.replaced-<time>.
"""
from __future__ import annotations

import argparse
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from course_utils.cli import Parser, device_spec, float_in, int_at_least, int_in, int_list, run_folder
from course_utils.runfolder import (STATES, ExitCode, Refused, RunFolder, StopSignal, config_changes, holds_run,
                                    read_status)

# On --resume, these fields may differ from the saved config: they do not change what the run computes
# (device and --deterministic change only the last bits). CHANGEABLE ones re-time the lr schedule or rescale
# the lr: only with --allow-change FIELD. Every other field is the run's identity.
FREE = {"out", "resume", "overwrite", "allow_change", "log_every", "no_progress", "logger", "ckpt_every_steps",
        "ckpt_every_seconds", "keep_last", "workers", "max_bad_steps", "bad_step_window", "device",
        "deterministic", "inject_nan_at_step"}
CHANGEABLE = ("lr", "epochs", "max_steps")


def build_parser() -> Parser:
    """Every option with a validator: a nonsense value ends in one line and exit code 2, before torch loads."""
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=run_folder, default="runs/pro", help="run folder (see above)")
    p.add_argument("--epochs", type=int_at_least(1), default=2)
    p.add_argument("--max-steps", type=int_at_least(0), default=0, help="stop after this many optimizer steps (0: no limit)")
    p.add_argument("--batch-size", type=int_at_least(1), default=128, help="the global batch size")
    p.add_argument("--lr", type=float_in(0, None, low_open=True), default=2e-3)
    p.add_argument("--weight-decay", type=float_in(0), default=5e-4)
    p.add_argument("--warmup-steps", type=int_at_least(0), default=50)
    p.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0)
    p.add_argument("--model", choices=["small", "tiny"], default="small")
    p.add_argument("--width", type=int_at_least(1), default=32, help="channel width of the model")
    p.add_argument("--amp", choices=["auto", "off", "bf16", "fp16"], default="auto",
                   help="auto: bf16 (or fp16) on a CUDA GPU, off on CPU")
    p.add_argument("--clip", type=float_in(0), default=1.0, help="max global grad norm (0: measure only)")
    p.add_argument("--ema-decay", type=float_in(0, 1, high_open=True), default=0.999, help="0 disables EMA")
    p.add_argument("--ckpt-every-steps", type=int_at_least(0), default=200, help="0: not by steps")
    p.add_argument("--ckpt-every-seconds", type=float_in(0), default=3600.0, help="0: not by time")
    p.add_argument("--keep-last", type=int_at_least(1), default=2, help="step_*.pt files kept besides best/last_good")
    p.add_argument("--data-fraction", type=float_in(0, 1, low_open=True), default=1.0)
    p.add_argument("--no-augment", action="store_true")
    p.add_argument("--workers", type=int_at_least(0), default=0, help="DataLoader worker processes")
    p.add_argument("--device", type=device_spec, default="auto", help="auto, cpu, cuda, cuda:1, mps")
    p.add_argument("--logger", action="append", choices=["jsonl", "tensorboard", "wandb"],
                   help="repeatable; jsonl is always on")
    p.add_argument("--log-every", type=int_at_least(1), default=20, help="steps between metric flushes (one host sync each)")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue the run in --out (from scratch if it has none)")
    start.add_argument("--overwrite", action="store_true",
                       help="start over: the old run in --out is renamed, not deleted")
    p.add_argument("--allow-change", action="append", choices=CHANGEABLE,
                   help="with --resume: let this field differ from the saved config (repeatable; recorded)")
    p.add_argument("--deterministic", action="store_true", help="deterministic kernels (slower on GPU)")
    p.add_argument("--max-bad-steps", type=int_at_least(1), default=5,
                   help="stop when this many of the last --bad-step-window steps were bad (inf/NaN or a loss spike)")
    p.add_argument("--bad-step-window", type=int_at_least(1), default=50,
                   help="window (steps) for --max-bad-steps and for judging a checkpoint healthy")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--inject-nan-at-step", type=int_list(1), default=(), help=argparse.SUPPRESS)  # tests, demos
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.allow_change and not args.resume:
        p.error("--allow-change 只在 --resume 时有意义")
    if args.max_bad_steps > args.bad_step_window:
        p.error(f"--max-bad-steps {args.max_bad_steps} 大于 --bad-step-window {args.bad_step_window},永远不会触发")
    return args


def refuse(exc: Refused) -> int:
    print(f"{Path(sys.argv[0]).name}: 拒绝运行: {exc}", file=sys.stderr)
    return ExitCode.REFUSED


def start(argv: list[str] | None = None) -> tuple[argparse.Namespace, StopSignal, RunFolder, dict | None, dict]:
    """All that can refuse the run, in milliseconds: flags, the folder lock, the run's identity on --resume.

    Returns (args, stop signal, claimed folder, the saved config it was checked against, allowed changes);
    exits with status 2 and one line when the run cannot start as asked.
    """
    args = parse_args(argv)
    stop = StopSignal().install()  # from here on SIGTERM/Ctrl-C ask for a clean stop, start-up included
    try:
        run = RunFolder.claim(args.out, resume=args.resume, overwrite=args.overwrite)
        saved = run.saved_config() if args.resume and holds_run(args.out) else None
        changes = {} if saved is None else config_changes(
            saved["hparams"], vars(args), free=FREE, changeable=CHANGEABLE, allowed=args.allow_change or (),
            defaults=vars(build_parser().parse_args([])))
    except Refused as exc:
        sys.exit(refuse(exc))
    return args, stop, run, saved, changes


if __name__ == "__main__":  # a typo, a busy folder or an incompatible --resume cost milliseconds, not torch's import
    STARTED = start()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from course_utils.amp import autocast, autocast_dtype, make_grad_scaler  # noqa: E402
from course_utils.checkpoint import CheckpointManager, restore_training_state, training_state  # noqa: E402
from course_utils.clipping import ClipResult, clip_gradients  # noqa: E402
from course_utils.data import (UnreadableDataError, batches_per_epoch, load_cifar10, make_loader,  # noqa: E402
                               take_fraction)
from course_utils.ema import EMA  # noqa: E402
from course_utils.env import pick_device  # noqa: E402
from course_utils.models import build_model  # noqa: E402
from course_utils.monitor import Monitor  # noqa: E402
from course_utils.repro import dump_run_config, set_deterministic, set_seed  # noqa: E402
from course_utils.schedule import make_scheduler  # noqa: E402


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Iterable, device: torch.device, dtype) -> tuple[float, float]:
    """(accuracy, mean loss) over ``batches``; restores the model's train/eval mode."""
    was_training = model.training
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    for x, y in batches:
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


def set_base_lr(optimizer: torch.optim.Optimizer, scheduler, lr: float) -> None:
    """Make ``lr`` the base lr of a restored LambdaLR schedule, and the next step's lr follow it.

    A restored optimizer carries the old lr in its param groups and the scheduler its old base lr:
    without this, ``--resume --lr X`` would be ignored. With an unchanged lr it recomputes the
    same value bit for bit (LambdaLR's own formula).
    """
    scheduler.base_lrs = [lr] * len(optimizer.param_groups)
    for group, factor in zip(optimizer.param_groups, scheduler.lr_lambdas):
        group["initial_lr"] = lr
        group["lr"] = lr * factor(scheduler.last_epoch)


def train(args: argparse.Namespace, stop: StopSignal, run: RunFolder, saved: dict | None, changes: dict) -> int:
    out = run.path
    try:
        device = pick_device(args.device)
    except RuntimeError as exc:
        raise Refused(f"--device {args.device}: {exc}") from None
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise Refused(f"--device {args.device}: 这台机器只有 {torch.cuda.device_count()} 个 CUDA GPU")
    if args.deterministic:  # warn (not fail) on the few CUDA ops that have no deterministic kernel
        set_deterministic(True, warn_only=True)
    set_seed(args.seed)

    # data: the order of every epoch depends only on (seed, epoch), so a resumed run sees the same batches
    train_ds = take_fraction(load_cifar10(True, augment=not args.no_augment, seed=args.seed), args.data_fraction)
    test_ds = take_fraction(load_cifar10(False), args.data_fraction)
    test_loader = make_loader(test_ds, 512, shuffle=False, num_workers=args.workers)
    steps_per_epoch = batches_per_epoch(len(train_ds), args.batch_size, drop_last=True)
    if steps_per_epoch == 0:
        raise Refused(f"--batch-size {args.batch_size} 大于训练集({len(train_ds)} 张);请调小 --batch-size")
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
    manager = CheckpointManager(out / "checkpoints", keep_last=args.keep_last, every_steps=args.ckpt_every_steps,
                                every_seconds=args.ckpt_every_seconds, keep_last_good=True)
    leftovers = run.remove_leftovers() + manager.remove_leftovers()  # we hold the lock: nobody else writes here
    if leftovers:
        print(f"清理了上次中断留下的 {len(leftovers)} 个临时文件/孤立校验和")

    # where to continue: the newest valid checkpoint; after a stop on bad steps, the last known-good one
    step, found = 0, None
    if args.resume:
        if (read_status(out, check_alive=False) or {}).get("state") == STATES[ExitCode.BAD_STEPS]:
            found = manager.load_last_good(map_location=device)
            print("上次因坏步停止: 从最后一个健康的检查点 last_good.pt 继续" if found else
                  "上次因坏步停止,且没有健康的检查点: 从 step 0 重新开始")
        else:
            found = manager.load_latest(map_location=device)
        if found is not None and "hparams" in found.state["config"]:  # the checkpoint must be this run's
            config_changes(found.state["config"]["hparams"], vars(args), free=FREE, changeable=CHANGEABLE,
                           allowed=CHANGEABLE, saved_as=f"检查点 {found.path.name} 的配置(它来自另一次运行?)")
        resume_from = found.state["step"] if found else 0
        # newer files are corrupt or belong to an abandoned trajectory: moved aside with a copy of the metrics
        aside = manager.set_aside(resume_from, also_copy=(out / "metrics.jsonl",))
        if aside:
            print(f"step {resume_from} 之后的文件不属于续训的轨迹,已移走(没有删除): "
                  + ", ".join(str(p.relative_to(out)) for p in aside))
        if found is None:
            print(f"--resume: {manager.directory} 里没有可用的检查点,从 step 0 开始")
    if found is None:
        config = run.record_changes(saved, changes, 0) if saved else dump_run_config(
            out, vars(args), device, repo=Path(__file__).resolve().parent)
    else:
        path, state = found
        meta = restore_training_state(state, model=model, optimizer=optimizer, scheduler=scheduler,
                                      scaler=scaler, ema=ema)
        step = meta["step"]
        set_base_lr(optimizer, scheduler, args.lr)  # --allow-change lr takes effect; unchanged lr: same bits
        config = run.record_changes(saved or state["config"], changes, step)
        if changes:
            print("已记录到 config.json 的 history: " + ", ".join(f"{k} {a} → {b}" for k, (a, b) in changes.items()))
        if state["config"].get("device") not in (None, str(device)):
            print(f"注意: 检查点在 {state['config']['device']} 上保存,现在在 {device} 上续训;数值不再逐位一致")
        print(f"从 {path.name} 续训: step {step}(epoch {step // steps_per_epoch},"
              f"epoch 内第 {step % steps_per_epoch} 个 batch)")
    monitor = Monitor(out, args.logger or ["jsonl"], flush_every=args.log_every, device=device,
                      total_steps=total_steps, resume_step=step if found else None, config=config,
                      progress=not args.no_progress, trouble_window=args.bad_step_window)
    if found is not None:
        monitor.load_state_dict(state["extra"]["monitor"])
    print(f"device={device} amp={amp_dtype or 'off'} steps={total_steps} ({steps_per_epoch}/epoch) "
          f"train={len(train_ds)} test={len(test_ds)} source={train_ds.source}")

    last_saved = step if found else None

    def save(metric: float | None = None) -> None:
        nonlocal last_saved
        with monitor.paused():
            monitor.flush()  # records up to this step are on disk before the checkpoint that covers them
            manager.save(training_state(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                                        ema=ema, epoch=step // steps_per_epoch, step=step,
                                        batch_in_epoch=step % steps_per_epoch, config=config,
                                        extra={"monitor": monitor.state_dict()}),
                         step, metric, healthy=monitor.healthy(step))
        last_saved = step

    def run_eval() -> float:
        with monitor.paused():
            acc, loss = evaluate(model, stop.iterate(test_loader), device, amp_dtype)
            metrics = {"acc": acc, "loss": loss}
            if ema is not None:
                metrics["acc_ema"], metrics["loss_ema"] = evaluate(ema.module, stop.iterate(test_loader), device,
                                                                   amp_dtype)
            monitor.log_eval(step, (step - 1) // steps_per_epoch, **metrics)
        return metrics.get("acc_ema", acc)

    run.write_status("running", step, total_steps=total_steps)
    exit_code = ExitCode.FINISHED
    batches = None
    model.train()
    while step < total_steps and not stop.requested:
        epoch, position = divmod(step, steps_per_epoch)
        if batches is None or position == 0:  # a new epoch, or the first batch after a resume
            batches = stop.iterate(make_loader(train_ds, args.batch_size, seed=args.seed, epoch=epoch,
                                               start_batch=position, num_workers=args.workers, drop_last=True,
                                               pin_memory=device.type == "cuda"))
        x, y = next(batches)
        result = train_step(model, x, y, optimizer=optimizer, scheduler=scheduler, scaler=scaler, ema=ema,
                            device=device, amp_dtype=amp_dtype, clip=args.clip,
                            inject_nan=step + 1 in args.inject_nan_at_step)
        step += 1
        monitor.log_step(step, epoch, result.loss, result.clip.norm, result.clip.clipped, result.lr, len(y),
                         skipped=result.skipped)
        if result.skipped and not scaler.is_enabled():
            monitor.alert("non-finite step", f"step {step}: loss/梯度出现 inf/NaN,已跳过本步(权重未更新)", step)
        if monitor.trouble.count(step) >= args.max_bad_steps:  # a rate over a window, not only a streak
            exit_code = ExitCode.BAD_STEPS
            break
        if step % steps_per_epoch == 0:  # end of an epoch: eval, best checkpoint
            save(run_eval())
        elif step == total_steps:  # --max-steps inside an epoch
            run_eval()
            save()
        elif manager.should_save(step):
            save()
    if exit_code == ExitCode.FINISHED and step < total_steps:  # SIGTERM/Ctrl-C: save here, stop cleanly
        if last_saved != step:
            save()
        exit_code = ExitCode.PREEMPTED

    if exit_code == ExitCode.BAD_STEPS:
        good = manager.last_good_step()
        where = (f"最后一个健康的检查点是 last_good.pt(step {good}),之后的检查点可能已含发散的权重,"
                 "--resume 会从 last_good.pt 继续" if good is not None else
                 "还没有健康的检查点,--resume 会从 step 0 重新开始")
        message = (f"最近 {args.bad_step_window} 步里有 {monitor.trouble.count(step)} 个坏步(inf/NaN 或 loss 尖峰),"
                   f"在 step {step} 停止训练。{where};先降低学习率(--resume --lr 更小的值 --allow-change lr)"
                   "或检查数据")
        monitor.alert("stopped", message, step)
    elif exit_code == ExitCode.PREEMPTED:
        message = f"收到 {stop.requested}: 已在 step {step} 保存检查点,安全退出。用 --resume 继续"
    else:
        message = f"完成: {step} 步,检查点在 {manager.directory}"
    monitor.close()
    run.write_status(STATES[exit_code], step, exit_code=int(exit_code), message=message, total_steps=total_steps,
                     last_good_step=manager.last_good_step())
    if exit_code != ExitCode.BAD_STEPS:  # that one was printed as an alert
        print(message)
    return exit_code


def failed(run: RunFolder, message: str) -> int:
    """Say what went wrong and what is still safe on one line; leave status.json saying "failed"."""
    steps = sorted(int(p.name.split("_")[1].split(".")[0]) for p in (run.path / "checkpoints").glob("step_*.pt.sha256"))
    safe = (f"磁盘上已有的检查点不受影响(最新: step {steps[-1]}),排除问题后用 --resume 继续" if steps
            else "还没有检查点")
    print(f"失败: {message}。{safe}", file=sys.stderr)
    try:
        run.write_status(STATES[ExitCode.FAILED], steps[-1] if steps else 0, exit_code=int(ExitCode.FAILED),
                         message=f"{message}。{safe}")
    except OSError as exc:  # a full disk may refuse even this small file
        print(f"(status.json 也无法写入: {exc.strerror})", file=sys.stderr)
    return ExitCode.FAILED


def main(args: argparse.Namespace, stop: StopSignal, run: RunFolder, saved: dict | None, changes: dict) -> int:
    """Train in the claimed folder; every way out leaves status.json and returns its ExitCode."""
    with run:
        if run.moved_aside:
            print(f"--overwrite: 原来的运行已改名为 {run.moved_aside}(没有删除)")
        try:
            return train(args, stop, run, saved, changes)
        except Refused as exc:  # a flag that only torch or the data could judge; nothing was changed
            return refuse(exc)
        except UnreadableDataError as exc:
            return failed(run, str(exc))
        except OSError as exc:  # disk full, read-only folder, a file system gone
            return failed(run, f"读写 {exc.filename or run.path} 失败({exc.strerror or exc})")
        except KeyboardInterrupt:
            return failed(run, "第二次 Ctrl-C: 立即停止,本次没有保存")
        except Exception as exc:
            traceback.print_exc()
            return failed(run, f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    exit_code = main(*STARTED)
    # status.json is written: a late SIGTERM must not kill the interpreter while it shuts down
    # (exit status -15, unflushed output); blocked, it is simply dropped at exit
    signal.pthread_sigmask(signal.SIG_BLOCK, StopSignal.SIGNALS)
    sys.exit(exit_code)
