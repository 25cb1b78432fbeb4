"""Run under torchrun (2 processes, gloo): measures what exact resume under DDP needs (tests/test_ddp_units.py).

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/support/ddp_probe.py RESULT.json

Rank 0 writes RESULT.json. Every case uses a small model with dropout (so the RNG streams matter),
AdamW (so the optimizer state matters) and a different data shard per rank:

- ``uneven``: a global batch of 5 on 2 ranks (3 + 2 samples). With each rank's mean loss weighted by
  n_r * world / batch, DDP's averaged gradient is the global batch's; unweighted, it is not.
- ``streams``: dropout masks with one seed on every rank (identical) and with ``seed_rank`` (different,
  reproducibly).
- ``resume``: train, checkpoint (every rank's RNG state), train on = the uninterrupted run; then rebuild and
  resume in four ways: as the script does (every rank loads the same file before DDP, restores its own RNG
  state), every rank restoring rank 0's RNG state, only rank 0 loading, rank 1 loading an older file.
- ``agreement``: the helpers of ``course_utils.distributed`` between real ranks.
"""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from course_utils.checkpoint import restore_training_state, training_state  # noqa: E402
from course_utils.data import rank_share  # noqa: E402
from course_utils.distributed import (RanksDisagree, World, any_rank, average, broadcast, from_main,  # noqa: E402
                                      gather, gather_rng_states, leave, same_on_all_ranks, seed_rank, setup,
                                      teardown)
from course_utils.repro import set_seed  # noqa: E402

SEED = 0


def build(rank: int, seeded: bool = True) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The same initial weights on every rank (one seed); then, with ``seeded``, each rank's own stream."""
    set_seed(SEED)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3)).double()
    if seeded and rank > 0:
        seed_rank(SEED, rank)
    return model, torch.optim.AdamW(model.parameters(), lr=0.05)


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s data at ``step`` (its own shard: different on every rank)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g)


def train(ddp: nn.Module, optimizer: torch.optim.Optimizer, steps: range, rank: int) -> list[float]:
    losses = []
    for step in steps:
        x, y = batch(step, rank)
        loss = F.cross_entropy(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def params(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def save(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> bytes | None:
    """Rank 0's checkpoint bytes, with every rank's RNG state (None on the other ranks)."""
    rng = gather_rng_states()
    if dist.get_rank() != 0:
        return None
    buffer = io.BytesIO()
    torch.save(training_state(model=model, optimizer=optimizer, epoch=0, step=step, rng_states=rng), buffer)
    return buffer.getvalue()


def uneven(rank: int, world: int) -> dict:
    """Max |DDP gradient - global batch gradient| with and without the share weighting."""
    torch.manual_seed(1)
    x, y = torch.randn(5, 8, dtype=torch.float64), torch.randint(0, 3, (5,))
    out = {}
    for weighted in (True, False):
        torch.manual_seed(2)
        model = nn.Linear(8, 3).double()
        reference = F.cross_entropy(model(x), y)  # the global batch, in one process
        expected = torch.autograd.grad(reference, list(model.parameters()))
        ddp = DistributedDataParallel(model)
        share = rank_share(5, rank, world)
        loss = F.cross_entropy(ddp(x[share]), y[share])
        if weighted:
            loss = loss * (len(y[share]) * world / 5)
        loss.backward()
        out["weighted" if weighted else "unweighted"] = max(
            (p.grad - e).abs().max().item() for p, e in zip(model.parameters(), expected))
        out.setdefault("shares", gather(len(y[share])))
    return out


def streams(rank: int) -> dict:
    """Dropout masks of every rank: one seed for all, then seed_rank, then seed_rank again."""
    def mask() -> list[float]:
        return F.dropout(torch.ones(32), 0.5).tolist()
    set_seed(SEED)
    alike = gather(mask())
    own, again = [], []
    for masks in (own, again):
        set_seed(SEED)
        if rank > 0:  # rank 0 keeps the stream of set_seed (the script's rule)
            seed_rank(SEED, rank)
        masks += gather(mask())
    return {"same_seed_equal": alike[0] == alike[1], "seed_rank_equal": own[0] == own[1], "reproducible": own == again}


def resume(rank: int) -> dict:
    """Uninterrupted run vs four ways of resuming from the checkpoint at step 4 (losses per rank, params)."""
    model, optimizer = build(rank)
    ddp = DistributedDataParallel(model)
    train(ddp, optimizer, range(0, 3), rank)
    older = broadcast(save(model, optimizer, 3))
    train(ddp, optimizer, range(3, 4), rank)
    ckpt = broadcast(save(model, optimizer, 4))
    expected = train(ddp, optimizer, range(4, 8), rank)
    expected_params = params(model)

    def resumed(load_on_this_rank: bool, data: bytes, rng_of: int, before_wrap: bool = True) -> dict:
        model, optimizer = build(rank, seeded=False)
        if not before_wrap:
            ddp = DistributedDataParallel(model)
        if load_on_this_rank:
            state = torch.load(io.BytesIO(data), weights_only=True)
            restore_training_state(state, model=model, optimizer=optimizer, rank=rng_of)
        if before_wrap:
            ddp = DistributedDataParallel(model)
        losses = train(ddp, optimizer, range(4, 8), rank)
        same_params = gather(params(model))
        return {"losses_equal": gather(losses == expected), "params_equal": params(model) == expected_params,
                "ranks_agree": same_params[0] == same_params[1]}

    return {
        "script": resumed(True, ckpt, rng_of=rank),
        "rank0_rng_everywhere": resumed(True, ckpt, rng_of=0),
        "only_rank0_loads_after_wrap": resumed(rank == 0, ckpt, rng_of=rank, before_wrap=False),
        "rank1_older_file": resumed(True, ckpt if rank == 0 else older, rng_of=rank),
    }


def agreement(rank: int) -> dict:
    out = {"any_rank_1_only": any_rank(rank == 1), "any_rank_none": any_rank(False),
           "from_main": list(from_main(rank == 0, float(10 + rank))),
           "broadcast": broadcast(f"from rank {rank}"), "gather": gather(rank * 10),
           "average": average(torch.tensor(float(rank))).item()}
    states = gather_rng_states()
    out["rng_states"] = None if states is None else len(states)
    same_on_all_ranks(7, "step")
    try:
        same_on_all_ranks(rank, "step")
        out["disagree_raises"] = False
    except RanksDisagree as exc:
        out["disagree_raises"] = str(exc)
    return out


def main() -> None:
    torch.set_num_threads(1)
    world = World.from_env()
    setup(world, torch.device("cpu"))
    rank = world.rank
    results = {"world": world.size, "uneven": uneven(rank, world.size), "streams": streams(rank),
               "resume": resume(rank)}
    results["agreement"] = gather(agreement(rank))
    if world.is_main:
        Path(sys.argv[1]).write_text(json.dumps(results, indent=1))
    teardown(world)
    leave(world, 0)  # not the interpreter's shutdown: it tears DDP's group down and now and then aborts (see leave)


if __name__ == "__main__":
    main()
