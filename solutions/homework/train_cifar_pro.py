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
  # several processes (DDP: one per GPU, or 2 on a CPU); --batch-size stays the global batch:
  torchrun --standalone --nproc-per-node 2 solutions/homework/train_cifar_pro.py --out runs/pro --epochs 2 --resume

Under torchrun every rank trains its share of each global batch; only rank 0 logs, evaluates
and writes files. A stop (SIGTERM, Ctrl-C) on any rank stops all of them at the same step,
saved once. A checkpoint holds every rank's RNG state; --resume continues exactly with the
same number of processes, and with another number keeps the global batch and the sample order.
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
import contextlib
import json
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from course_utils.cli import Parser, device_spec, float_in, int_at_least, int_in, int_list, run_folder
from course_utils.distributed import World, leave
from course_utils.runfolder import (STATES, ExitCode, Refused, RunFolder, StopSignal, config_changes, holds_run,
                                    read_status)

# On --resume, these fields may differ from the saved config: they do not change what the run computes
# (device and --deterministic change only the last bits). CHANGEABLE ones re-time the lr schedule or rescale
# the lr: only with --allow-change FIELD. Every other field is the run's identity.
FREE = {"out", "resume", "overwrite", "allow_change", "log_every", "no_progress", "logger", "ckpt_every_steps",
        "ckpt_every_seconds", "keep_last", "workers", "max_bad_steps", "bad_step_window", "device",
        "deterministic", "inject_nan_at_step", "async_ckpt", "sample_ledger"}
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
    p.add_argument("--dropout", type=float_in(0, 1, high_open=True), default=0.0,
                   help="dropout before the head; 0: no layer")
    p.add_argument("--amp", choices=["auto", "off", "bf16", "fp16"], default="auto",
                   help="auto: bf16 (or fp16) on a CUDA GPU, off on CPU")
    p.add_argument("--clip", type=float_in(0), default=1.0, help="max global grad norm (0: measure only)")
    p.add_argument("--ema-decay", type=float_in(0, 1, high_open=True), default=0.999, help="0 disables EMA")
    p.add_argument("--ckpt-every-steps", type=int_at_least(0), default=200, help="0: not by steps")
    p.add_argument("--ckpt-every-seconds", type=float_in(0), default=3600.0, help="0: not by time")
    p.add_argument("--keep-last", type=int_at_least(1), default=2, help="step_*.pt files kept besides best/last_good")
    p.add_argument("--async-ckpt", action="store_true",
                   help="write checkpoints in a background thread: training waits only for a copy of the state "
                        "in host memory (costs one state's size of host memory)")
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
    p.add_argument("--sample-ledger", action="store_true", help=argparse.SUPPRESS)  # tests: samples of each step
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


def start(argv: list[str] | None = None) -> tuple[argparse.Namespace, StopSignal, RunFolder | None, dict | None,
                                                dict, World]:
    """All that can refuse the run, in milliseconds: flags, the folder lock, the run's identity on --resume.

    Returns (args, stop signal, claimed folder, the saved config it was checked against, allowed changes,
    this process's place in the job); exits with status 2 and one line when the run cannot start as asked.
    Under torchrun only rank 0 claims the folder (the others get None); its refusal stops the job.
    """
    args = parse_args(argv)
    try:
        world = World.from_env()  # torchrun's RANK, WORLD_SIZE...; rank 0 of 1 in a plain run
    except ValueError as exc:
        sys.exit(refuse(Refused(str(exc))))
    stop = StopSignal()
    if not world.launched:  # from here on SIGTERM/Ctrl-C ask for a clean stop, start-up included
        stop.install()      # (under torchrun once the process group is up: see train)
    if not world.is_main:
        return args, stop, None, None, {}, world
    try:
        run = RunFolder.claim(args.out, resume=args.resume, overwrite=args.overwrite)
        saved = run.saved_config() if args.resume and holds_run(args.out) else None
        changes = {} if saved is None else config_changes(
            saved["hparams"], vars(args), free=FREE, changeable=CHANGEABLE, allowed=args.allow_change or (),
            defaults=vars(build_parser().parse_args([])))
    except Refused as exc:
        sys.exit(refuse(exc))
    return args, stop, run, saved, changes, world


if __name__ == "__main__":  # a typo, a busy folder or an incompatible --resume cost milliseconds, not torch's import
    STARTED = start()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from course_utils.amp import autocast, autocast_dtype, make_grad_scaler  # noqa: E402
from course_utils.checkpoint import (CheckpointManager, CorruptCheckpointError, LoadedCheckpoint,  # noqa: E402
                                     load_verified, restore_training_state, training_state)
from course_utils.clipping import ClipResult, clip_gradients  # noqa: E402
from course_utils.data import (UnreadableDataError, batches_per_epoch, load_cifar10, make_loader,  # noqa: E402
                               take_fraction)
from course_utils.distributed import (RanksDisagree, any_rank, average, backend_for, broadcast,  # noqa: E402
                                      from_main, gather, gather_rng_states, same_on_all_ranks, seed_rank, setup,
                                      teardown)
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
               clip: float, inject_nan: bool = False, phase: Callable[[str], None] | None = None,
               loss_weight: float = 1.0) -> StepResult:
    """One optimizer step: forward under autocast, fp32 loss, backward, unscale + clip, step or skip.

    A step whose gradients are not finite is skipped: fp16's GradScaler does it itself (and lowers
    its scale); under bf16/fp32 nothing else would notice, so the pre-clip norm is checked here.
    A skipped step advances neither the schedule nor the EMA. ``phase(name)`` is called after each
    part (``bench/overhead.py`` uses it to attribute time); training passes nothing.
    ``loss_weight``: under DDP, this rank's share of the global batch times the number of ranks
    (1 when the shares are equal): DDP's average of the ranks' gradients is then the global batch's.
    """
    mark = phase or (lambda name: None)
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    with autocast(device, amp_dtype):
        logits = model(x)
    loss = F.cross_entropy(logits.float(), y)  # loss in fp32
    if loss_weight != 1.0:
        loss = loss * loss_weight
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


def pick_rank_device(spec: str, world: World) -> torch.device:
    """``--device`` for this process: under torchrun each process takes the GPU ``LOCAL_RANK`` names."""
    try:
        device = pick_device(spec)
    except RuntimeError as exc:
        raise Refused(f"--device {spec}: {exc}") from None
    if world.launched and device.type == "mps":
        raise Refused("多进程训练需要 CUDA(NCCL)或 CPU(gloo);MPS 不支持,请用 --device cpu")
    if world.launched and device.type == "cuda":  # an explicit index only with one process per machine
        if device.index is not None and world.local_size > 1:
            raise Refused(f"--device {spec}: torchrun 下每个进程用 cuda:LOCAL_RANK;请用 --device cuda 或 auto")
        device = torch.device("cuda", world.local_rank if device.index is None else device.index)
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise Refused(f"--device {spec}: 这台机器只有 {torch.cuda.device_count()} 个 CUDA GPU"
                      + (f",--nproc-per-node {world.local_size} 太多" if world.local_size > 1 else ""))
    return device


def choose_checkpoint(args: argparse.Namespace, run: RunFolder, manager: CheckpointManager,
                      device: torch.device) -> LoadedCheckpoint | None:
    """Rank 0: the checkpoint to continue from (newest valid; after a stop on bad steps, the last known-good one),
    checked to belong to this run; newer files set aside. None: start from step 0."""
    out = run.path
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
    return found


def train(args: argparse.Namespace, stop: StopSignal, run: RunFolder | None, saved: dict | None, changes: dict,
          world: World) -> int:
    out, main = args.out, world.is_main  # run (the claimed folder) is None on ranks other than 0
    device = pick_rank_device(args.device, world)
    setup(world, device)  # torchrun: join the other ranks (init_process_group); a plain run: nothing
    if world.launched:
        stop.install()  # now a stop can be agreed on; before, SIGTERM just ended a process with nothing to save
    if args.deterministic:  # warn (not fail) on the few CUDA ops that have no deterministic kernel
        set_deterministic(True, warn_only=True)
    set_seed(args.seed)  # the same on every rank: the same initial weights (each rank's own stream: see below)

    # data: the order of every epoch depends only on (seed, epoch), so a resumed run sees the same batches;
    # each rank trains on its share of every global batch of --batch-size
    train_ds = take_fraction(load_cifar10(True, augment=not args.no_augment, seed=args.seed, quiet=not main),
                             args.data_fraction)
    steps_per_epoch = batches_per_epoch(len(train_ds), args.batch_size, drop_last=True)
    if steps_per_epoch == 0:
        raise Refused(f"--batch-size {args.batch_size} 大于训练集({len(train_ds)} 张);请调小 --batch-size")
    if args.batch_size < world.size:
        raise Refused(f"--batch-size {args.batch_size} 是全局 batch,小于进程数 {world.size}:"
                      "每个进程至少要分到 1 个样本")
    if main:  # rank 0 evaluates on the whole test set; the other ranks wait for it at the next collective
        test_ds = take_fraction(load_cifar10(False), args.data_fraction)
        test_loader = make_loader(test_ds, 512, shuffle=False, num_workers=args.workers)
    total_steps = args.epochs * steps_per_epoch
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)

    # model, optimizer (fp32 master weights), schedule, AMP, EMA
    model = build_model(args.model, width=args.width, dropout=args.dropout).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = make_scheduler(optimizer, args.warmup_steps, total_steps)
    amp_dtype = autocast_dtype(device, args.amp)
    scaler = make_grad_scaler(device, amp_dtype)
    # warm-up: with decay 0.999 a short run would evaluate weights close to the random init. Rank 0 only: after
    # each step the weights are the same on every rank, and rank 0 evaluates and saves the average
    ema = EMA(model, decay=args.ema_decay, warmup=True) if args.ema_decay > 0 and main else None
    if not main:  # ranks other than 0 write nothing: no checkpoint manager, no monitor, no config
        manager = monitor = config = None
    else:
        manager = CheckpointManager(out / "checkpoints", keep_last=args.keep_last, every_steps=args.ckpt_every_steps,
                                    every_seconds=args.ckpt_every_seconds, keep_last_good=True,
                                    async_save=args.async_ckpt)
        leftovers = run.remove_leftovers() + manager.remove_leftovers()  # we hold the lock: nobody else writes here
        if leftovers:
            print(f"清理了上次中断留下的 {len(leftovers)} 个临时文件/孤立校验和")

    # where to continue: rank 0 chooses; every rank loads that same file before DDP wraps the model
    step, found, refusal = 0, None, None
    if args.resume and main:
        try:
            found = choose_checkpoint(args, run, manager, device)
        except Refused as exc:  # a checkpoint of another run: every rank must stop, not only rank 0
            refusal = str(exc)
    name, refusal = broadcast((found.path.name if found else None, refusal))
    if refusal:
        raise Refused(refusal)
    problem = None
    if name is not None and not main:
        try:
            found = LoadedCheckpoint(out / "checkpoints" / name,
                                     load_verified(out / "checkpoints" / name, map_location=device))
        except CorruptCheckpointError as exc:
            problem = f"读不到 {exc}(多机训练时 --out 须在各节点共享的文件系统上)"
    same_on_all_ranks(problem or (name, found.state["step"] if found else 0), "续训起点(检查点, step)")
    if found is None:
        if main:
            config = run.record_changes(saved, changes, 0) if saved else dump_run_config(
                out, vars(args), device, repo=Path(__file__).resolve().parent)
    else:
        path, state = found
        saved_world = state.get("world_size", 1)  # how many processes wrote it
        meta = restore_training_state(state, model=model, optimizer=optimizer, scheduler=scheduler,
                                      scaler=scaler, ema=ema, rank=world.rank, restore_rng=world.rank < saved_world)
        step = meta["step"]
        set_base_lr(optimizer, scheduler, args.lr)  # --allow-change lr takes effect; unchanged lr: same bits
        if main:
            config = run.record_changes(saved or state["config"], changes, step)
            if changes:
                print("已记录到 config.json 的 history: " + ", ".join(f"{k} {a} → {b}" for k, (a, b) in changes.items()))
            if state["config"].get("device") not in (None, str(device)):
                print(f"注意: 检查点在 {state['config']['device']} 上保存,现在在 {device} 上续训;数值不再逐位一致")
            if saved_world != world.size:
                print(f"注意: 检查点由 {saved_world} 个进程保存,现在是 {world.size} 个: 全局 batch 仍是 "
                      f"{args.batch_size},样本顺序不变;求和顺序变了,数值不再逐位一致")
            print(f"从 {path.name} 续训: step {step}(epoch {step // steps_per_epoch},"
                  f"epoch 内第 {step % steps_per_epoch} 个 batch)")
    if world.rank > 0 and (found is None or world.rank >= saved_world):
        seed_rank(args.seed, world.rank, step)  # its own random stream (rank 0 keeps the one set_seed started)
    # DDP after the load: it copies rank 0's weights to every rank and averages the gradients in backward.
    # `model` stays the unwrapped module: it is what rank 0 evaluates and saves (no "module." prefixes)
    ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if world.launched else model
    if main:
        monitor = Monitor(out, args.logger or ["jsonl"], flush_every=args.log_every, device=device,
                          total_steps=total_steps, resume_step=step if found else None, config=config,
                          progress=not args.no_progress, trouble_window=args.bad_step_window)
        if found is not None:
            monitor.load_state_dict(state["extra"]["monitor"])
        print(f"device={device} amp={amp_dtype or 'off'} steps={total_steps} ({steps_per_epoch}/epoch) "
              f"train={len(train_ds)} test={len(test_ds)} source={train_ds.source}"
              + (f" processes={world.size} backend={backend_for(device)} (每个进程约 {args.batch_size // world.size}"
                 " 个样本/步)" if world.launched else ""))

    last_saved = step if found else None

    def save(metric: float | None = None) -> None:
        nonlocal last_saved
        same_on_all_ranks(step, "step")  # a rank off by one would save a state that no step had
        rng_states = gather_rng_states()  # every rank's, on rank 0
        if main:
            with monitor.paused():
                monitor.flush()  # records up to this step are on disk before the checkpoint that covers them
                manager.save(training_state(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                                            ema=ema, epoch=step // steps_per_epoch, step=step,
                                            batch_in_epoch=step % steps_per_epoch, config=config,
                                            extra={"monitor": monitor.state_dict()}, rng_states=rng_states),
                             step, metric, healthy=monitor.healthy(step))
        last_saved = step

    def run_eval() -> float | None:
        if not main:
            return None
        with monitor.paused():
            acc, loss = evaluate(model, stop.iterate(test_loader), device, amp_dtype)
            metrics = {"acc": acc, "loss": loss}
            if ema is not None:
                metrics["acc_ema"], metrics["loss_ema"] = evaluate(ema.module, stop.iterate(test_loader), device,
                                                                   amp_dtype)
            monitor.log_eval(step, (step - 1) // steps_per_epoch, **metrics)
        return metrics.get("acc_ema", acc)

    if main:
        run.write_status("running", step, total_steps=total_steps, world_size=world.size)
    exit_code = ExitCode.FINISHED
    batches = None
    model.train()
    while step < total_steps and not any_rank(stop.requested):  # a stop on any rank: all leave at this step
        epoch, position = divmod(step, steps_per_epoch)
        if batches is None or position == 0:  # a new epoch, or the first batch after a resume
            loader = make_loader(train_ds, args.batch_size, seed=args.seed, epoch=epoch, start_batch=position,
                                 num_workers=args.workers, drop_last=True, pin_memory=device.type == "cuda",
                                 rank=world.rank, world_size=world.size)  # this rank's share of each global batch
            batches = stop.iterate(loader)
            shares = iter(loader.batch_sampler) if args.sample_ledger else None  # the indices of those batches
        x, y = next(batches)
        result = train_step(ddp_model, x, y, optimizer=optimizer, scheduler=scheduler, scaler=scaler, ema=ema,
                            device=device, amp_dtype=amp_dtype, clip=args.clip,
                            inject_nan=step + 1 in args.inject_nan_at_step,
                            loss_weight=len(y) * world.size / args.batch_size)
        step += 1
        if args.sample_ledger:  # tests: the samples (and labels) each rank trained on at this step
            ledger = gather((next(shares), y.tolist()))
            if main:
                with open(out / "sample_ledger.jsonl", "a", encoding="utf-8") as f:
                    f.write(json.dumps({"step": step, "world_size": world.size, "indices": [i for i, _ in ledger],
                                        "labels": [labels for _, labels in ledger]}) + "\n")
        loss = average(result.loss)  # the global batch's mean loss (each rank's loss is weighted by its share)
        bad = time_to_save = False
        if main:
            manager.check()  # --async-ckpt: a background save that failed stops the run here, not at the next save
            monitor.log_step(step, epoch, loss, result.clip.norm, result.clip.clipped, result.lr, args.batch_size,
                             skipped=result.skipped)
            if result.skipped and not scaler.is_enabled():
                monitor.alert("non-finite step", f"step {step}: loss/梯度出现 inf/NaN,已跳过本步(权重未更新)", step)
            bad = monitor.trouble.count(step) >= args.max_bad_steps  # a rate over a window, not only a streak
            time_to_save = manager.should_save(step)
        bad, time_to_save = from_main(bad, time_to_save)  # rank 0 holds the metrics and the clock
        if bad:
            exit_code = ExitCode.BAD_STEPS
            break
        if step % steps_per_epoch == 0:  # end of an epoch: eval, best checkpoint
            save(run_eval())
        elif step == total_steps:  # --max-steps inside an epoch
            run_eval()
            save()
        elif time_to_save:
            save()
    if exit_code == ExitCode.FINISHED and step < total_steps:  # SIGTERM/Ctrl-C on some rank: save here, stop cleanly
        if last_saved != step:
            save()
        exit_code = ExitCode.PREEMPTED
        received = "、".join(f"{sig}(rank {r})" for r, sig in enumerate(gather(stop.requested)) if sig) \
            if world.launched else stop.requested

    if main:
        manager.wait()  # --async-ckpt: the save in flight is on disk before status.json says how the run ended
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
            message = f"收到 {received}: 已在 step {step} 保存检查点,安全退出。用 --resume 继续"
        else:
            message = f"完成: {step} 步,检查点在 {manager.directory}"
        monitor.close()
        run.write_status(STATES[exit_code], step, exit_code=int(exit_code), message=message, total_steps=total_steps,
                         last_good_step=manager.last_good_step(), world_size=world.size)
        if exit_code != ExitCode.BAD_STEPS:  # that one was printed as an alert
            print(message)
    teardown(world)  # every rank waits until rank 0 has written status.json, then leaves the process group
    return exit_code


def failed(run: RunFolder | None, message: str, world: World) -> int:
    """Say what went wrong and what is still safe on one line; leave status.json saying "failed" (rank 0)."""
    if run is None:  # a rank other than 0: it owns no file; torchrun stops the job, rank 0 records it
        print(f"rank {world.rank} 失败: {message}", file=sys.stderr)
        return ExitCode.FAILED
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


def main(args: argparse.Namespace, stop: StopSignal, run: RunFolder | None, saved: dict | None, changes: dict,
         world: World) -> int:
    """Train in the claimed folder; every way out leaves status.json (rank 0) and returns its ExitCode."""
    with run if run is not None else contextlib.nullcontext():
        if run is not None and run.moved_aside:
            print(f"--overwrite: 原来的运行已改名为 {run.moved_aside}(没有删除)")
        try:
            return train(args, stop, run, saved, changes, world)
        except Refused as exc:  # a flag that only torch or the data could judge; nothing was changed
            return refuse(exc) if world.is_main else ExitCode.REFUSED
        except (UnreadableDataError, RanksDisagree) as exc:
            return failed(run, str(exc), world)
        except OSError as exc:  # disk full, read-only folder, a file system gone
            return failed(run, f"读写 {exc.filename or args.out} 失败({exc.strerror or exc})", world)
        except KeyboardInterrupt:
            return failed(run, "第二次 Ctrl-C: 立即停止,本次没有保存", world)
        except Exception as exc:
            traceback.print_exc()
            return failed(run, f"{type(exc).__name__}: {exc}", world)


if __name__ == "__main__":
    exit_code = main(*STARTED)
    # status.json is written: a late SIGTERM must not kill the interpreter while it shuts down
    # (exit status -15, unflushed output); blocked, it is simply dropped at exit
    signal.pthread_sigmask(signal.SIG_BLOCK, StopSignal.SIGNALS)
    leave(STARTED[-1], exit_code)  # sys.exit; under torchrun without the interpreter's shutdown (see leave)
