"""Data parallel training under ``torchrun``: what a training script must make the ranks agree on.

``torchrun --nproc-per-node N train.py ...`` starts N copies of the script (one per GPU, or
several on a CPU) and tells each where it stands through the environment: ``RANK`` (0 to
``WORLD_SIZE`` - 1 over the whole job), ``LOCAL_RANK`` (on this machine: the GPU index),
``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``. Wrapped in ``DistributedDataParallel`` (DDP),
the model's gradients are averaged over the ranks during ``backward``. Everything else the
ranks must agree on is the script's job, and each omission fails quietly:

- the same data on every rank: without a shard per rank, N GPUs train on one GPU's data N
  times. ``course_utils.data.make_loader(..., rank=, world_size=)`` gives each rank its share
  of every global batch;
- the same random stream on every rank: seeded alike, every rank draws the same dropout masks
  (and the same random augmentation, if it draws from the global RNG). ``seed_rank`` gives each
  rank its own stream; ``gather_rng_states`` collects every rank's state for the checkpoint,
  and each rank restores its own;
- every rank writing: N processes writing one checkpoint or log file race and interleave.
  Only rank 0 writes; the others take part through collectives;
- a decision one rank makes alone: a rank that leaves the loop on SIGTERM while the others wait
  in the next all-reduce hangs the job until a timeout. A decision that is not a pure function
  of the step (a signal, the clock, rank 0's metrics) goes through ``any_rank`` or ``from_main``;
- resuming from different files: a rank that loads another (or no) checkpoint diverges
  silently. DDP copies rank 0's weights when it wraps the model, but not the optimizer state.
  Rank 0 picks the file, ``broadcast`` sends its name, every rank loads it *before* DDP wraps the
  model, and ``same_on_all_ranks`` checks that they all stand at the same step;
- ``module.`` prefixes: ``DistributedDataParallel(model).state_dict()`` prefixes every key.
  Save the unwrapped model so a checkpoint loads with or without DDP.

In a plain ``python train.py`` run there is no process group: every function here gives the
single-process answer (``any_rank(flag)`` is ``flag``...) without touching ``torch.distributed``.

Like ``runfolder`` and ``cli``, this module imports only the standard library when it loads: a
script reads its rank (``World.from_env()``) before it imports torch, so that only rank 0
claims the run folder, in milliseconds. The functions that talk to other ranks import
``torch.distributed`` when they are called.

Example::

    world = World.from_env()                       # rank 0 of 1 in a plain run
    setup(world, device)                            # init_process_group, when launched by torchrun
    model = build_model().to(device)                # same seed on every rank: same initial weights
    name = broadcast(newest_checkpoint_name() if world.is_main else None)
    ...                                             # every rank loads `name`, then:
    ddp_model = DistributedDataParallel(model)      # rank 0's weights copied to every rank
    if world.rank > 0:
        seed_rank(seed, world.rank)                 # then each rank its own random stream
    while not any_rank(stop.requested):             # SIGTERM on any rank stops them all here
        ...
    teardown(world)                                 # wait for rank 0's last write, leave the group
    leave(world, exit_code)                         # sys.exit, or os._exit under torchrun (see leave)

Taught in ``11_multi_process``.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, NoReturn

if TYPE_CHECKING:
    import torch

__all__ = ["LAUNCH_VARIABLES", "World", "RanksDisagree", "backend_for", "rank_device", "setup", "teardown", "leave",
           "any_rank", "from_main", "average", "broadcast", "gather", "same_on_all_ranks", "gather_rng_states",
           "rank_seed", "seed_rank"]


# What torchrun (or any launcher using the env:// rendezvous) sets for every process it starts.
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class World:
    """Where this process stands in the job: ``rank`` of ``size`` processes; ``local_rank`` of
    ``local_size`` on this machine. ``launched`` is True under torchrun (even with one process:
    then the process group, and NCCL on a GPU, are used all the same)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    launched: bool = False

    @property
    def is_main(self) -> bool:
        """Rank 0: the only process that logs and writes files."""
        return self.rank == 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "World":
        """Read torchrun's variables; a plain run (none of them set) is rank 0 of 1.

        Raises ``ValueError`` (a Chinese message) when only some are set or they make no sense.
        """
        env = os.environ if environ is None else environ
        present = [k for k in LAUNCH_VARIABLES if k in env]
        if not present:
            return cls()
        if len(present) < len(LAUNCH_VARIABLES):
            missing = ", ".join(k for k in LAUNCH_VARIABLES if k not in env)
            raise ValueError(f"多进程启动的环境变量不全(缺少 {missing});请用 torchrun 启动")
        try:
            rank, size, local_rank = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])
            local_size = int(env.get("LOCAL_WORLD_SIZE", size))
        except ValueError:
            raise ValueError("RANK / WORLD_SIZE / LOCAL_RANK 应为整数;请用 torchrun 启动") from None
        if not (0 <= rank < size and 0 <= local_rank < local_size <= size):
            raise ValueError(f"RANK={rank} WORLD_SIZE={size} LOCAL_RANK={local_rank} 不一致;请用 torchrun 启动")
        return cls(rank, size, local_rank, local_size, launched=True)


class RanksDisagree(RuntimeError):
    """The ranks hold different values where they must agree (the message lists each rank's)."""


def backend_for(device: "torch.device | str") -> str:
    """The process-group backend for ``device``: NCCL between GPUs, gloo between CPU processes.

    With NCCL every collective runs on the GPU, the small agreements of this module too (a flag
    becomes a one-element CUDA tensor; reading it back waits for the GPU, about as long as the
    finiteness check the training step already does).
    """
    kind = getattr(device, "type", str(device).split(":")[0])
    return "nccl" if kind == "cuda" else "gloo"


def rank_device(spec: str, world: World) -> "torch.device":
    """``--device`` for this process: under torchrun each process takes the GPU ``LOCAL_RANK`` names.

    ``Refused`` (one line) for a device this machine or this launch cannot use.
    """
    import torch

    from course_utils.env import pick_device
    from course_utils.runfolder import Refused
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


def setup(world: World, device: "torch.device", timeout_s: float | None = None) -> None:
    """Join the job's process group (``init_process_group`` from torchrun's variables); nothing in a plain run.

    Returns once every rank has joined. ``timeout_s``: how long one collective may wait (None: torch's
    default, 30 minutes on gloo); a hang watchdog (``course_utils.heartbeat``) should fire before it. On a GPU, select ``device`` first: two ranks on one GPU
    is an NCCL error, and an unselected device means rank r's NCCL traffic goes through GPU 0.
    """
    if not world.launched:
        return
    import torch
    import torch.distributed as dist
    if device.type == "cuda":
        torch.cuda.set_device(device)
    import datetime
    timeout = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s else {}
    # a key prefix per torchrun attempt (--max-restarts): without it, measured here with torch 2.14.1, the third
    # attempt's gloo connect went to an address no process listened on (connection refused), or hung
    store, rank, size = next(dist.rendezvous("env://", **timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend_for(device), store=dist.PrefixStore(f"attempt_{attempt}", store), rank=rank,
                            world_size=size, device_id=device if device.type == "cuda" else None, **timeout)


def teardown(world: World) -> None:
    """Wait for every rank (so no rank exits while rank 0 still writes), then leave the process group.

    Call it on the normal way out only: after an error the other ranks are not at this barrier.
    """
    dist = _group()
    if dist is None:
        return
    dist.barrier()
    dist.destroy_process_group()


def leave(world: World, exit_code: int) -> NoReturn:
    """End the process with ``exit_code``; under torchrun without the interpreter's shutdown.

    Why: ``DistributedDataParallel`` keeps the process group alive after ``destroy_process_group``
    (it holds references to it that are never released), so the group is torn down while the
    interpreter shuts down, and now and then that aborts the process (SIGABRT, "terminate called
    without an active exception": 2 of about 130 two-process runs here). torchrun then reports a
    finished job as failed and stops the other ranks with SIGTERM. Call it last, when every file
    is written and closed: it flushes stdout and stderr and calls ``os._exit``. A plain run exits
    normally (``sys.exit``).
    """
    if not world.launched:
        sys.exit(exit_code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def _group() -> Any:
    """``torch.distributed`` when a process group is up, else None (a plain single-process run)."""
    import torch.distributed as dist
    return dist if dist.is_available() and dist.is_initialized() else None


def _flags_device(dist: Any) -> str:
    """Where the small agreement tensors live: the current GPU under NCCL (it moves CUDA tensors only), else the CPU."""
    return "cuda" if dist.get_backend() == "nccl" else "cpu"


def any_rank(flag: Any) -> bool:
    """True on every rank when ``flag`` is true on at least one (one small all-reduce).

    The way to act on a signal: SIGTERM reaches one rank (a preempted node), ``any_rank(stop.requested)``
    makes every rank leave the loop at the same step.
    """
    dist = _group()
    if dist is None:
        return bool(flag)
    import torch
    value = torch.tensor([1.0 if flag else 0.0], device=_flags_device(dist))
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def from_main(*values: float | bool) -> tuple[float | bool, ...]:
    """Rank 0's ``values`` (bools or numbers) on every rank (one small broadcast).

    For decisions only rank 0 can make: it holds the metrics (stop on bad steps) and its clock
    decides a time-based save; the other ranks pass placeholders of the same types.
    """
    dist = _group()
    if dist is None:
        return values
    import torch
    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_flags_device(dist))
    dist.broadcast(tensor, src=0)
    return tuple(type(v)(x) for v, x in zip(values, tensor.tolist()))


def average(tensor: "torch.Tensor") -> "torch.Tensor":
    """The mean of ``tensor`` over the ranks (a new tensor; ``tensor`` itself in a plain run).

    With each rank's loss weighted as ``course_utils.data`` says, this is the global batch's mean loss.
    Gloo has no averaging all-reduce: the sum is divided by the number of ranks.
    """
    dist = _group()
    if dist is None:
        return tensor
    total = tensor.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / dist.get_world_size()


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` (any picklable value, e.g. the name of the checkpoint to resume from) on every rank."""
    dist = _group()
    if dist is None:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, rank r's at index r, on every rank (``[obj]`` in a plain run)."""
    dist = _group()
    if dist is None:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def same_on_all_ranks(value: Any, what: str) -> None:
    """Raise ``RanksDisagree`` on every rank unless every rank holds the same ``value``.

    Used where a mismatch would corrupt the run without an error: the step before a save, the
    checkpoint and step after a load. ``what`` names the value in the message.
    """
    values = gather(value)
    if any(v != values[0] for v in values):
        shown = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
        raise RanksDisagree(f"各进程的{what}不一致({shown})")


def gather_rng_states() -> list[dict[str, Any]] | None:
    """Every rank's RNG state (``course_utils.repro.rng_state``), rank r's at index r, on rank 0; None elsewhere.

    Put the list into the checkpoint (``training_state(..., rng_states=...)``); on resume each rank
    restores its own entry. In a plain run: ``[rng_state()]``.
    """
    from course_utils.repro import rng_state
    dist = _group()
    state = rng_state()
    if dist is None:
        return [state]
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(state, out, dst=0)
    return out


def rank_seed(seed: int, rank: int, step: int = 0) -> int:
    """A 32-bit seed for ``rank``'s own random stream, from ``(seed, rank, step)`` (numpy's ``SeedSequence``:
    nearby inputs give unrelated seeds, unlike ``seed + rank``, which makes run 1's rank 0 run 0's rank 1)."""
    import numpy as np
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


def seed_rank(seed: int, rank: int, step: int = 0) -> None:
    """Seed every generator of this process (python, numpy, torch, CUDA) with ``rank_seed(seed, rank, step)``.

    Call it after the model is built (every rank builds it from the same seed, so the initial weights
    agree) and before the first step. Rank 0 may simply keep the stream ``set_seed(seed)`` started: a
    one-process torchrun job then computes exactly what a plain run does. ``step``: where the stream
    starts, for a rank that joins a resumed run and has no saved state (the number of processes grew).
    """
    from course_utils.repro import set_seed
    set_seed(rank_seed(seed, rank, step))
