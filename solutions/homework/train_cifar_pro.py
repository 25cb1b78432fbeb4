"""Professional CIFAR-10 training: the chapter 0.2 script with the chapter 0.4 upgrades.

What it adds to a plain loop, each visible below: seeding + config/git dump · AMP (bf16/fp16, GradScaler
only for fp16) · global-norm clipping with the pre-clip norm logged · EMA weights evaluated next to the raw
ones · full checkpoints (atomic, checksummed) every N steps and every T seconds · exact resume after a kill,
mid-epoch included · SIGTERM/Ctrl-C saves and exits · NaN steps skipped · JSONL/TensorBoard/wandb metrics
with spike alerts · on too many bad steps, stop or (--on-spike rollback) reload last_good.pt, skip the
batches that caused it and go on, on the record · a hang (no rank makes progress) ended and named.

  python solutions/homework/train_cifar_pro.py --out runs/pro --epochs 2
  # kill it any time (even kill -9), then continue exactly where it was:
  python solutions/homework/train_cifar_pro.py --out runs/pro --epochs 2 --resume
  # several processes (DDP: one per GPU, or 2 on a CPU); --batch-size stays the global batch:
  torchrun --standalone --nproc-per-node 2 solutions/homework/train_cifar_pro.py --out runs/pro --epochs 2 --resume

Under torchrun every rank trains its share of each global batch; only rank 0 logs, evaluates and writes
files (every rank writes its own heartbeat). A stop (SIGTERM, Ctrl-C) on any rank stops all of them at the
same step, saved once. A checkpoint holds every rank's RNG state; --resume continues exactly with the same
number of processes, and with another number keeps the global batch and the sample order.
The run folder (--out) holds one run:
  config.json    the run's identity. --resume refuses a command line that would change the
                 trajectory (batch size, seed, data, model...); --lr, --epochs and --max-steps
                 change only with --allow-change FIELD, recorded in config.json's "history".
                 --batch-size is the global batch (the whole job's, however many processes).
  status.json    how the run ended: finished / preempted / stopped_bad_steps / failed / hung (running
                 while it runs), also under launchers that fold exit codes. Exit codes of a plain run:
                 0 finished, 1 failed, 2 refused (bad flag or folder conflict: nothing changed),
                 3 stopped on bad steps, 75 preempted (saved; run again with --resume), 124 hung.
                 "history": the run's rollbacks (--on-spike rollback).
  checkpoints/   the last 2 step_*.pt (--keep-last) + best.pt + last_good.pt (the newest one saved
                 while training was healthy) + the one a process resumed from, until it ends. Files
                 a resume will not continue from go to corrupt/ or superseded/, never deleted.
  run.lock       a second run in the same folder is refused (fcntl.lockf).
  skipped_batches.json  every rollback and the samples of every global batch it skipped.
  heartbeats/    each rank's step and phase while the run lives; hangs/: one folder per hang (--hang-timeout:
                 no rank made progress for so long): report.json and every live rank's thread stacks.
(course_utils.runfolder.RunFiles names every file.) Starting without --resume in a folder that holds a
run is refused; --overwrite starts over and renames the old run to <out>.replaced-<time>.

Reading order: the flags and ``start`` run before torch is imported (a typo, a busy folder or a refused
--resume costs milliseconds); then ``main`` → ``train`` → ``prepare`` / ``resume`` → ``loop`` → ``train_step``
→ ``save`` / ``finish``. Three parts are objects from course_utils that the loop calls: the data position
(``RunBatches``), the rollback (``Rollback``) and the hang watch (``HangGuard``).
"""
from __future__ import annotations

import argparse
import contextlib
import signal
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from course_utils.cli import (PROBE_FLAGS, Parser, Started, add_probe_flags, check_combinations, device_spec, float_in,
                              guarded, int_at_least, int_in, resume_notes, run_folder, start_run)
from course_utils.distributed import World, leave
from course_utils.estimate_ckpt import seconds_or_auto, tune_saves
from course_utils.runfolder import ExitCode, Refused, RunFiles, RunFolder, config_changes
from course_utils.signals import StopSignal

# On --resume, these fields may differ from the saved config: they do not change what the run computes
# (device and --deterministic change only the last bits). CHANGEABLE ones re-time the lr schedule or rescale
# the lr: only with --allow-change FIELD. Every other field is the run's identity.
FREE = {"out", "resume", "overwrite", "allow_change", "log_every", "no_progress", "logger", "ckpt_every_steps",
        "ckpt_every_seconds", "keep_last", "workers", "max_bad_steps", "bad_step_window", "device",
        "deterministic", "async_ckpt", "peak_flops", "hang_timeout", "accum_steps", "mtbf", *PROBE_FLAGS}
CHANGEABLE = ("lr", "epochs", "max_steps")
ROLLBACK_FLAGS = ("skip_batches", "rollback_lr_factor", "max_rollbacks")  # only with --on-spike rollback


def build_parser() -> Parser:
    """Every option with a validator: a nonsense value ends in one line and exit code 2, before torch loads."""
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=run_folder, default="runs/pro", help="run folder (see above)")
    p.add_argument("--epochs", type=int_at_least(1), default=2)
    p.add_argument("--max-steps", type=int_at_least(0), default=0, help="stop after this many optimizer steps (0: no limit)")
    p.add_argument("--batch-size", type=int_at_least(1), default=128, help="the global batch size")
    p.add_argument("--accum-steps", type=int_at_least(1), default=1, help="micro-batches per optimizer step and process "
                   "(gradient accumulation): the step of one batch of --batch-size in about 1/K of the activation memory "
                   "(the largest micro-batch's); equal up to rounding without BatchNorm (--model tiny), approximate with "
                   "it (statistics per micro-batch)")
    p.add_argument("--lr", type=float_in(0, None, low_open=True), default=2e-3)
    p.add_argument("--weight-decay", type=float_in(0), default=5e-4)
    p.add_argument("--warmup-steps", type=int_at_least(0), default=50)
    p.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0)
    p.add_argument("--model", choices=["small", "tiny"], default="small")
    p.add_argument("--width", type=int_at_least(1), default=32, help="channel width of the model")
    p.add_argument("--dropout", type=float_in(0, 1, high_open=True), default=0.0, help="dropout before the head; 0: no layer")
    p.add_argument("--amp", choices=["auto", "off", "bf16", "fp16"], default="auto", help="auto: bf16 (or fp16) on a CUDA GPU, off on CPU")
    p.add_argument("--clip", type=float_in(0), default=1.0, help="max global grad norm (0: measure only)")
    p.add_argument("--ema-decay", type=float_in(0, 1, high_open=True), default=0.999, help="0 disables EMA")
    p.add_argument("--ckpt-every-steps", type=int_at_least(0), default=200, help="0: not by steps")
    p.add_argument("--ckpt-every-seconds", type=seconds_or_auto, default=3600.0,
                   help="0: not by time; auto: Young's interval sqrt(2 x save time x --mtbf), from the saves measured (08 §7)")
    p.add_argument("--mtbf", type=float_in(0, None, low_open=True), help="mean seconds between preemptions (for auto)")
    p.add_argument("--keep-last", type=int_at_least(1), default=2, help="step_*.pt files kept besides best/last_good")
    p.add_argument("--async-ckpt", action="store_true", help="write checkpoints in a background thread: training waits "
                   "only for a copy of the state in host memory (costs one state's size of host memory)")
    p.add_argument("--data-fraction", type=float_in(0, 1, low_open=True), default=1.0)
    p.add_argument("--no-augment", action="store_true")
    p.add_argument("--workers", type=int_at_least(0), default=0, help="DataLoader worker processes")
    p.add_argument("--device", type=device_spec, default="auto", help="auto, cpu, cuda, cuda:1, mps")
    p.add_argument("--logger", action="append", choices=["jsonl", "tensorboard", "wandb", "swanlab"], help="repeatable; jsonl is always on")
    p.add_argument("--log-every", type=int_at_least(1), default=20, help="steps between metric flushes (one host sync each)")
    p.add_argument("--peak-flops", type=float_in(0), default=0.0,
                   help="peak FLOP/s per process for the logged mfu (0: measured once at start-up on a CPU; "
                        "on a GPU give the datasheet's dense number, see 08b §4, or no mfu is logged)")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue the run in --out (from scratch if it has none)")
    start.add_argument("--overwrite", action="store_true", help="start over: the old run in --out is renamed, not deleted")
    p.add_argument("--allow-change", action="append", choices=CHANGEABLE,
                   help="with --resume: let this field differ from the saved config (repeatable; recorded)")
    p.add_argument("--deterministic", action="store_true", help="deterministic kernels (slower on GPU)")
    add_spike_flags(p)
    p.add_argument("--hang-timeout", type=float_in(0), default=None, help="seconds without progress on any rank that end "
                   "the run as hung (exit code 124; default: 20x the median step within [60 s, 25 min]; at least 120 s "
                   "before a process's first step; 0: off; under 5: refused)")
    p.add_argument("--no-progress", action="store_true")
    add_probe_flags(p)  # hidden: faults that tests and demos inject (PROBE_FLAGS; course_tools.probes.Probes)
    return p


def add_spike_flags(p: Parser) -> None:
    """The bad-step alarm (--max-bad-steps of --bad-step-window) and what it does: --on-spike and its rollback."""
    p.add_argument("--max-bad-steps", type=int_at_least(1), default=5,
                   help="stop when this many of the last --bad-step-window steps were bad (inf/NaN or a loss spike)")
    p.add_argument("--bad-step-window", type=int_at_least(1), default=50,
                   help="window (steps) for --max-bad-steps and for judging a checkpoint healthy")
    p.add_argument("--on-spike", choices=["stop", "rollback"], default="stop",
                   help="when --max-bad-steps fires: stop (exit code 3), or reload last_good.pt in the same process, "
                        "skip the global batches from there to the bad one + --skip-batches and go on")
    p.add_argument("--skip-batches", type=int_at_least(0), default=10,
                   help="--on-spike rollback: global batches skipped after the bad one")
    p.add_argument("--rollback-lr-factor", type=float_in(0, 1, low_open=True), default=1.0,
                   help="--on-spike rollback: the lr is multiplied by this at every rollback")
    p.add_argument("--max-rollbacks", type=int_at_least(1), default=3,
                   help="--on-spike rollback: the alarm after this many rollbacks stops the run as stop does")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, each checked alone, then together (``course_utils.cli.check_combinations``: one line, exit 2)."""
    p = build_parser()
    return check_combinations(p, p.parse_args(argv), rollback_only=ROLLBACK_FLAGS)


def start(argv: list[str] | None = None) -> Started:
    """The flags, then all that can refuse the run (``course_utils.cli.start_run``): exit 2 and one line."""
    return start_run(parse_args(argv), free=FREE, changeable=CHANGEABLE, defaults=vars(build_parser().parse_args([])))


if __name__ == "__main__":  # a typo, a busy folder or an incompatible --resume cost milliseconds, not torch's import:
    STARTED = start()  # so torch and the helpers that need it are imported only here, below

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from course_utils.amp import autocast, autocast_dtype, make_grad_scaler  # noqa: E402
from course_utils.checkpoint import (CheckpointManager, LoadedCheckpoint, restore_training_state,  # noqa: E402
                                     share_checkpoint, training_state)
from course_utils.checkpoint_async import AsyncCheckpointManager  # noqa: E402
from course_utils.clipping import ClipResult, clip_gradients  # noqa: E402
from course_utils.data import UnreadableDataError, load_cifar10, make_loader, take_fraction  # noqa: E402
from course_utils.distributed import (RanksDisagree, any_rank, average, backend_for, from_main,  # noqa: E402
                                      gather, gather_rng_states, rank_device, same_on_all_ranks, seed_rank, setup,
                                      teardown)
from course_utils.ema import EMA  # noqa: E402
from course_utils.estimate import mfu_inputs  # noqa: E402
from course_utils.evaluation import evaluate  # noqa: E402
from course_utils.hang_guard import HangGuard, collective_timeout_s  # noqa: E402
from course_utils.models import build_model  # noqa: E402
from course_utils.monitor import Monitor  # noqa: E402
from course_utils.repro import dump_run_config, set_deterministic, set_seed  # noqa: E402
from course_utils.rollback import Rollback, SkipSet  # noqa: E402
from course_utils.run_batches import RunBatches  # noqa: E402
from course_utils.schedule import make_scheduler, set_base_lr  # noqa: E402


def hooks_for(args: argparse.Namespace, world: World, files: RunFiles) -> SimpleNamespace:
    """What tests and demos attach: the probes (``course_tools.probes``) if a hidden flag asks; else hooks doing nothing."""
    if any(getattr(args, name) for name in PROBE_FLAGS):
        from course_tools.probes import Probes
        return Probes(args, world, files)
    return SimpleNamespace(data=lambda dataset: dataset, attach=lambda model: None, phase_entered=None,
                           before_step=lambda step, position, x, y: (x, y), after_step=lambda step, loader, y: None)


def main(args: argparse.Namespace, stop: StopSignal, run: RunFolder | None, saved: dict | None, changes: dict,
         world: World) -> int:
    """Train in the claimed folder; every way out leaves status.json (rank 0) and returns its ExitCode: a refusal
    (exit 2), or a failure said on one line (``course_utils.cli.guarded``: data, ranks, disk, Ctrl-C, a crash)."""
    with run if run is not None else contextlib.nullcontext():
        files = run.files if run is not None else RunFiles.read_only(args.out)  # ranks > 0 only read checkpoints
        return guarded(lambda: train(args, stop, run, saved, changes, world, hooks_for(args, world, files)),
                       run, world, args.out, expected=(UnreadableDataError, RanksDisagree))


@dataclass
class Training:
    """One process's run: what ``prepare`` builds at step 0 and ``resume`` restores; the loop advances ``step``."""

    args: argparse.Namespace
    world: World
    stop: StopSignal
    run: RunFolder | None  # the claimed folder on rank 0 (status.json, config.json); None on the other ranks
    device: torch.device
    data: RunBatches  # this rank's share of every global batch, and the data position
    test_loader: torch.utils.data.DataLoader | None  # rank 0 evaluates on the whole test set
    model: torch.nn.Module  # the unwrapped module: what rank 0 evaluates and saves (no "module." prefixes)
    optimizer: torch.optim.Optimizer
    amp_dtype: torch.dtype | None
    scaler: torch.amp.GradScaler
    ema: EMA | None
    manager: CheckpointManager | None  # ranks other than 0 write nothing: no manager, no monitor, no config
    rollback: Rollback  # --on-spike rollback: the skipped batches, on the record
    scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
    ddp_model: torch.nn.Module | None = None  # what trains: the model, wrapped by DDP under torchrun
    monitor: Monitor | None = None
    hang: HangGuard | None = None  # heartbeats, the hang watchdog and the stragglers (every rank)
    step: int = 0
    last_saved: int | None = None  # the step of the newest checkpoint this process saved or resumed from

    @property
    def files(self) -> RunFiles:
        """The run folder's file map (a read-only view on ranks > 0)."""
        return self.run.files if self.run is not None else RunFiles.read_only(self.args.out)

    @property
    def total_steps(self) -> int:
        every_epoch = self.args.epochs * self.data.per_epoch
        return min(every_epoch, self.args.max_steps or every_epoch)

    @property
    def parts(self) -> dict:
        """What every checkpoint carries besides the five elements: name -> object with a state_dict."""
        return {"rollback": self.rollback, **({"monitor": self.monitor} if self.monitor is not None else {})}

    def progress(self) -> dict:
        """What status.json says besides the state: the run's length and its number of processes."""
        return {"total_steps": self.total_steps, "world_size": self.world.size}


def train(args: argparse.Namespace, stop: StopSignal, run: RunFolder | None, saved: dict | None,
          changes: dict, world: World, hooks: SimpleNamespace) -> ExitCode:
    """The whole run of one process: prepare (step 0), resume (a checkpoint, if any), loop, finish. The loop runs
    in the hang watch (``HangGuard``: heartbeat hooks on the model and optimizer, a watchdog thread that ends the job
    when no rank makes progress for --hang-timeout s, status "hung"). Not around finish: rank 0 may close its
    loggers (a wandb upload) for longer while the others wait at the last barrier."""
    device = rank_device(args.device, world)  # --device; under torchrun cuda:LOCAL_RANK
    # torchrun: join the other ranks (init_process_group), collectives timing out after the watchdog; plain: nothing
    setup(world, device, collective_timeout_s(args.hang_timeout))
    if world.launched:
        stop.install()  # now a stop can be agreed on; before, SIGTERM just ended a process with nothing to save
    t = prepare(args, stop, run, world, device, hooks)
    resume(t, saved, changes)
    hooks.attach(t.model)  # the tests' probes (hidden flags); the default hooks do nothing
    t.model.train()
    if t.run is not None:
        t.run.running(t.step, **t.progress())  # status.json: "running"
    with HangGuard(world, t.files, run, t.ddp_model, t.optimizer, timeout=args.hang_timeout, every=args.log_every,
                   status=lambda: {"step": t.step, **t.progress()}, on_enter=hooks.phase_entered) as t.hang:
        exit_code = loop(t, hooks)
    return finish(t, exit_code)


def prepare(args: argparse.Namespace, stop: StopSignal, run: RunFolder | None, world: World, device: torch.device,
            hooks: SimpleNamespace) -> Training:
    """Step 0 of this process: seeds, data, model, optimizer, schedule, AMP, EMA, checkpoints, rollbacks."""
    main = world.is_main
    if args.deterministic:  # warn (not fail) on the few CUDA ops that have no deterministic kernel
        set_deterministic(True, warn_only=True)
    set_seed(args.seed)  # the same on every rank: the same initial weights (each rank's own stream: see resume)

    # data: the order of every epoch depends only on (seed, epoch), so a resumed run sees the same batches;
    # each rank trains on its share of every global batch of --batch-size
    train_ds = hooks.data(take_fraction(load_cifar10(True, augment=not args.no_augment, seed=args.seed,
                                                     quiet=not main), args.data_fraction))
    rollback = Rollback(SkipSet(len(train_ds), args.batch_size, args.seed, drop_last=True),
                        enabled=args.on_spike == "rollback", skip_batches=args.skip_batches,
                        lr_factor=args.rollback_lr_factor, max_rollbacks=args.max_rollbacks, run=run)
    data = RunBatches(train_ds, args.batch_size, seed=args.seed, world=world, stop=stop, workers=args.workers,
                      pin_memory=device.type == "cuda", skips=rollback.skips if rollback.enabled else None)
    data.check(args.accum_steps)  # Refused: a --batch-size or --accum-steps that cannot work, in one line
    # rank 0 evaluates on the whole test set; the other ranks wait for it at the next collective
    test_loader = make_loader(take_fraction(load_cifar10(False), args.data_fraction), 512, shuffle=False,
                              num_workers=args.workers) if main else None

    # model, optimizer (fp32 master weights), schedule, AMP, EMA
    model = build_model(args.model, width=args.width, dropout=args.dropout).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    amp_dtype = autocast_dtype(device, args.amp)
    # warm-up: with decay 0.999 a short run would evaluate weights close to the random init. Rank 0 only: after
    # each step the weights are the same on every rank, and rank 0 evaluates and saves the average
    ema = EMA(model, decay=args.ema_decay, warmup=True) if args.ema_decay > 0 and main else None
    manager = None
    if main:
        manager = (AsyncCheckpointManager if args.async_ckpt else CheckpointManager)(
            run.files.checkpoints, keep_last=args.keep_last, every_steps=args.ckpt_every_steps,
            every_seconds=0 if args.mtbf else args.ckpt_every_seconds, keep_last_good=True)
        if args.mtbf:  # --ckpt-every-seconds auto: Young's interval from the saves measured (course_utils.estimate_ckpt)
            tune_saves(manager, args.mtbf)
        run.remove_leftovers(manager)  # we hold the lock: nobody else writes here
    t = Training(args, world, stop, run, device, data, test_loader, model, optimizer, amp_dtype,
                 make_grad_scaler(device, amp_dtype), ema, manager, rollback)
    t.scheduler = make_scheduler(optimizer, args.warmup_steps, t.total_steps)
    return t


def resume(t: Training, saved: dict | None, changes: dict) -> None:
    """Where to continue: rank 0 chooses, every rank loads that same file before DDP wraps the model; rank 0
    records the run's identity (config.json, with the allowed changes) and starts the monitor."""
    args, world, main = t.args, t.world, t.world.is_main
    found, refusal = None, None
    if args.resume and main:
        try:  # a checkpoint of this run only: the command line is checked against its config too
            found = t.run.choose_checkpoint(t.manager, t.device, check=lambda hparams, name: config_changes(
                hparams, vars(args), free=FREE, changeable=CHANGEABLE, allowed=CHANGEABLE,
                saved_as=f"检查点 {name} 的配置(它来自另一次运行?)"))
        except Refused as exc:  # a checkpoint of another run: every rank must stop, not only rank 0
            refusal = str(exc)
    found = share_checkpoint(found, t.files.checkpoints, t.world, t.device, "续训起点(检查点, step)", refusal)
    if main:
        identity = saved or (found.state["config"] if found else None)  # config.json's, or the checkpoint's
        t.run.config = t.run.record_changes(identity, changes, found.state["step"] if found else 0) if identity \
            else dump_run_config(t.files, vars(args), t.device, repo=Path(__file__).resolve().parent)
    saved_world = continue_from(t, found)  # how many processes wrote the checkpoint
    if main and found:  # what differs since the checkpoint (changes, device, processes), then where the run goes on
        for note in resume_notes(changes, found.state["config"].get("device"), t.device, saved_world, world.size,
                                 args.batch_size):
            print(note)
        print(f"从 {found.path.name} 续训: step {t.step}(epoch {t.step // t.data.per_epoch},"
              f"epoch 内第 {t.step % t.data.per_epoch} 个 batch)")
    # DDP after the load: it copies rank 0's weights to every rank and averages the gradients in backward
    t.ddp_model = DistributedDataParallel(t.model, device_ids=[t.device.index] if t.device.type == "cuda" else None) \
        if world.launched else t.model
    if main:
        print(f"device={t.device} amp={t.amp_dtype or 'off'} steps={t.total_steps} ({t.data.per_epoch}/epoch) "
              f"train={len(t.data.dataset)} test={len(t.test_loader.dataset)} source={t.data.dataset.source}"
              + (f" processes={world.size} backend={backend_for(t.device)} (每个进程约 {args.batch_size // world.size}"
                 " 个样本/步)" if world.launched else ""))


def continue_from(t: Training, found: LoadedCheckpoint | None) -> int:
    """Every rank: the run as checkpoint ``found`` left it (as built when None): weights, optimizer, schedule,
    scaler, EMA, its RNG state, every part, the lr (--lr times the rollbacks' factors), the data position; rank 0's
    monitor from that step (metrics.jsonl cut back to it). How many processes saved ``found`` (0: none)."""
    args, world = t.args, t.world
    if world.is_main:  # the mfu's FLOPs and peak (--peak-flops, else a CPU's): measured once, kept through a rollback
        mfu = (t.monitor.flops_per_sample, t.monitor.peak_flops) if t.monitor is not None else \
            mfu_inputs(t.model, args.peak_flops, world.size, t.device)
        t.monitor = Monitor(
            t.files, args.logger or ["jsonl"], flush_every=args.log_every, device=t.device, total_steps=t.total_steps,
            resume_step=found.state["step"] if found else None, config=t.run.config, progress=not args.no_progress,
            trouble_window=args.bad_step_window)
        t.monitor.set_mfu(*mfu)
    saved_world = found.state.get("world_size", 1) if found else 0
    if found:
        t.step = t.last_saved = restore_training_state(
            found.state, model=t.model, optimizer=t.optimizer, scheduler=t.scheduler, scaler=t.scaler, ema=t.ema,
            parts=t.parts, rank=world.rank, restore_rng=world.rank < saved_world)["step"]
        # --allow-change lr and a rollback's factor take effect; an unchanged lr: the same bits
        set_base_lr(t.optimizer, t.scheduler, args.lr * t.rollback.lr_scale())
    if world.rank > 0 and world.rank >= saved_world:  # its own random stream (rank 0 keeps set_seed's)
        seed_rank(args.seed, world.rank, t.step)
    t.data.restart(t.step)
    if world.is_main:
        t.rollback.attach(t.monitor)  # a rollback's records go to this monitor
    return saved_world


def loop(t: Training, hooks: SimpleNamespace) -> ExitCode:
    """One optimizer step per turn; eval and checkpoints where they fall due. FINISHED, BAD_STEPS or PREEMPTED."""
    args, world, main = t.args, t.world, t.world.is_main
    while t.step < t.total_steps:
        if any_rank(t.stop.requested):  # a stop (SIGTERM, Ctrl-C) on any rank: all leave at this step
            return ExitCode.PREEMPTED
        with t.hang.step(t.step + 1, t.monitor):  # phase "data"; every --log-every steps, the ranks' step times
            epoch, position, x, y = t.data.next(t.step)
            x, y = hooks.before_step(t.step + 1, position, x, y)
            result = train_step(t.ddp_model, x, y, optimizer=t.optimizer, scheduler=t.scheduler, scaler=t.scaler,
                                ema=t.ema, device=t.device, amp_dtype=t.amp_dtype, clip=args.clip,
                                loss_weight=len(y) * world.size / args.batch_size, accum_steps=args.accum_steps)
            t.step += 1
            hooks.after_step(t.step, t.data.loader, y)
            loss = average(result.loss)  # the global batch's mean loss (each rank's loss is weighted by its share)
        bad = time_to_save = False
        if main:
            t.manager.check()  # --async-ckpt: a background save that failed stops the run here, not at the next save
            t.monitor.log_step(t.step, epoch, loss, result.clip.norm, result.clip.clipped, result.lr,
                               args.batch_size, skipped=result.skipped)
            if result.skipped and not t.scaler.is_enabled():
                t.monitor.alert("non-finite step", f"step {t.step}: loss/梯度出现 inf/NaN,已跳过本步(权重未更新)", t.step)
            bad = t.monitor.trouble.count(t.step) >= args.max_bad_steps  # a rate over a window, not only a streak
            time_to_save = t.manager.should_save(t.step)
        bad, time_to_save = from_main(bad, time_to_save)  # rank 0 holds the metrics and the clock
        if bad and roll_back(t):  # --on-spike rollback: back to last_good.pt, the data skipped; the loop goes on
            continue
        if bad:
            return ExitCode.BAD_STEPS
        if t.step % t.data.per_epoch == 0:  # end of an epoch: eval, best checkpoint
            save(t, evaluate_now(t))
        elif t.step == t.total_steps:  # --max-steps inside an epoch
            evaluate_now(t)
            save(t)
        elif time_to_save:
            save(t)
    return ExitCode.FINISHED


def roll_back(t: Training) -> bool:
    """--on-spike rollback (``course_utils.rollback.Rollback.recover``) through this script's load, restore and save;
    False: stop as --on-spike stop does (not asked for, --max-rollbacks reached, or no healthy checkpoint yet)."""
    rolled = t.rollback.recover(t.step, load=lambda: last_good(t), go_back=lambda found: continue_from(t, found),
                                save=lambda: save(t))
    if rolled and t.run is not None:
        t.run.running(t.step, **t.progress())  # status.json: "running" again, with the rollback in its history
    return rolled


def last_good(t: Training) -> LoadedCheckpoint | None:
    """Every rank: last_good.pt for a rollback (None: there is none); rank 0 sets the later files aside."""
    if t.world.is_main:  # --async-ckpt: the save in flight is on disk before files move
        t.manager.wait()
    found = share_checkpoint(t.manager.load_last_good(map_location=t.device) if t.world.is_main else None,
                             t.files.checkpoints, t.world, t.device, "回滚到的检查点(last_good.pt, step)")
    if found is not None and t.world.is_main:  # the later files belong to the abandoned trajectory
        t.monitor.close()
        t.manager.set_aside(found.state["step"], also_copy=(t.files.metrics,))
    return found


@dataclass
class StepResult:
    """What one optimizer step reports; ``loss`` and ``clip`` stay on the device (no host sync)."""

    loss: torch.Tensor
    clip: ClipResult
    lr: float
    skipped: bool


def train_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, optimizer: torch.optim.Optimizer,
               scheduler, scaler: torch.amp.GradScaler, ema: EMA | None, device: torch.device, amp_dtype,
               clip: float, loss_weight: float = 1.0, accum_steps: int = 1) -> StepResult:
    """One optimizer step: forward and backward (of ``accum_steps`` micro-batches), unscale + clip, step or skip,
    then the schedule and the EMA.

    A skipped step (gradients not finite) advances neither the schedule nor the EMA.
    ``loss_weight``: under DDP, this rank's share of the global batch times the number of ranks
    (1 when the shares are equal): DDP's average of the ranks' gradients is then the global batch's.
    ``accum_steps`` K: the batch is cut into K micro-batches (sizes differ by at most one), each loss weighted
    by its part of the batch, their gradients summed; then one unscale, one clip of the accumulated norm, one
    step (GradScaler: one ``update``): the step of the whole batch, in 1/K of its activation memory.
    """
    optimizer.zero_grad(set_to_none=True)  # once per window: inside it would keep only the last micro-batch
    loss = sum(forward_backward(model, xs, ys, scaler=scaler, device=device, amp_dtype=amp_dtype,
                                loss_weight=loss_weight * (len(ys) / len(y)), sync=i == accum_steps - 1)
               for i, (xs, ys) in enumerate(zip(x.tensor_split(accum_steps), y.tensor_split(accum_steps))))
    result = clip_gradients(model.parameters(), clip, scaler=scaler, optimizer=optimizer)
    lr = optimizer.param_groups[0]["lr"]
    skipped = optimizer_step(optimizer, scaler, result)
    if not skipped:
        scheduler.step()
        if ema is not None:
            ema.update(model)
    return StepResult(loss=loss.detach(), clip=result, lr=lr, skipped=skipped)


def forward_backward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, scaler: torch.amp.GradScaler,
                     device: torch.device, amp_dtype, loss_weight: float = 1.0, sync: bool = True) -> torch.Tensor:
    """Forward under autocast, the loss in fp32 (times ``loss_weight``), backward of the scaled loss, which adds
    to ``.grad``; the loss. ``sync`` False: under DDP, the gradients are not all-reduced in this backward
    (``no_sync``: the first micro-batches of a window; the last one's backward all-reduces the sum)."""
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    with model.no_sync() if not sync and isinstance(model, DistributedDataParallel) else contextlib.nullcontext():
        with autocast(device, amp_dtype):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        if loss_weight != 1.0:
            loss = loss * loss_weight
        scaler.scale(loss).backward()
    return loss.detach()


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, clipped: ClipResult) -> bool:
    """Step, unless the gradients are not finite (then True: skipped). fp16's GradScaler skips such a step itself
    (and lowers its scale); under bf16/fp32 nothing else would notice, so the pre-clip norm's finiteness is read
    here (one host sync)."""
    if scaler.is_enabled():
        scale_before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        return scaler.get_scale() < scale_before
    if not clipped.is_finite():
        return True
    optimizer.step()
    return False


def save(t: Training, metric: float | None = None) -> None:
    """A full checkpoint of this step: every rank sends its RNG state, rank 0 writes."""
    t.hang.enter("save")
    same_on_all_ranks(t.step, "step")  # a rank off by one would save a state that no step had
    rng_states = gather_rng_states()  # every rank's, on rank 0
    if t.world.is_main:
        with t.monitor.paused():
            t.monitor.flush()  # records up to this step are on disk before the checkpoint that covers them
            t.manager.save(training_state(model=t.model, optimizer=t.optimizer, scheduler=t.scheduler,
                                          scaler=t.scaler, ema=t.ema, step=t.step, **t.data.saved(),
                                          config=t.run.config, rng_states=rng_states, parts=t.parts),
                           t.step, metric, healthy=t.monitor.healthy(t.step))
    t.last_saved = t.step


def evaluate_now(t: Training) -> float | None:
    """Rank 0: accuracy and loss of the weights (and of the EMA weights), logged; the metric for best.pt."""
    if not t.world.is_main:
        return None
    with t.monitor.paused():
        batches = lambda: t.hang.each(t.stop.iterate(t.test_loader), "eval")  # noqa: E731 (a beat per batch)
        metrics = evaluate(t.model, batches(), t.device, t.amp_dtype)
        if t.ema is not None:
            metrics |= {f"{k}_ema": v for k, v in evaluate(t.ema.module, batches(), t.device, t.amp_dtype).items()}
        t.monitor.log_eval(t.step, (t.step - 1) // t.data.per_epoch, **metrics)
    return metrics.get("acc_ema", metrics["acc"])


def finish(t: Training, exit_code: ExitCode) -> ExitCode:
    """A stop saves this step; rank 0 waits for the saves, writes status.json and says how the run ended."""
    step, main = t.step, t.world.is_main
    if exit_code == ExitCode.PREEMPTED:  # SIGTERM/Ctrl-C on some rank: save here, stop cleanly
        if t.last_saved != step:
            save(t)
        received = "、".join(f"{sig}(rank {r})" for r, sig in enumerate(gather(t.stop.requested)) if sig) \
            if t.world.launched else t.stop.requested
    if main:
        t.manager.wait()  # --async-ckpt: the save in flight is on disk before status.json says how the run ended
        if exit_code == ExitCode.BAD_STEPS:  # what the alarm found, where --resume continues, what to change
            message = t.rollback.stop_message(step, t.monitor.trouble.count(step), t.args.bad_step_window,
                                              t.manager.last_good_step())
            t.monitor.alert("stopped", message, step)
        elif exit_code == ExitCode.PREEMPTED:
            message = f"收到 {received}: 已在 step {step} 保存检查点,安全退出。用 --resume 继续"
        else:
            message = f"完成: {step} 步,检查点在 {t.manager.directory}"
        t.monitor.close()
        t.run.ended(exit_code, step, message, last_good_step=t.manager.last_good_step(), **t.progress())
        if exit_code != ExitCode.BAD_STEPS:  # that one was printed as an alert
            print(message)
    teardown(t.world)  # every rank waits until rank 0 has written status.json, then leaves the process group
    return exit_code


if __name__ == "__main__":
    exit_code = main(*STARTED)
    # status.json is written: a late SIGTERM, blocked, is dropped (not exit status -15 with unflushed output)
    signal.pthread_sigmask(signal.SIG_BLOCK, StopSignal.SIGNALS)
    leave(STARTED[-1], exit_code)  # sys.exit; under torchrun without the interpreter's shutdown (see leave)
