"""Data parallel pieces without the training script: the sharding rule, per-rank RNG states, the agreement helpers.

Most tests run in this process (a plain run: no process group). ``test_gloo_probe`` runs
``tests/support/ddp_probe.py`` under torchrun with 2 gloo processes and measures the conditions of exact
resume under DDP.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import Dataset

from course_utils import distributed
from course_utils.checkpoint import restore_training_state, training_state
from course_utils.data import EpochBatches, epoch_order, make_loader, rank_share
from course_utils.distributed import World
from course_utils.repro import rng_state, set_seed
from tests.support.notebook_cells import ROOT

TORCHRUN_ENV = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
                "MASTER_PORT": "1"}


def test_world_from_env():
    assert World.from_env({}) == World() and World().is_main and not World().launched
    world = World.from_env(TORCHRUN_ENV)
    assert (world.rank, world.size, world.local_rank, world.local_size, world.launched, world.is_main) == \
        (1, 4, 1, 2, True, False)
    one = World.from_env({**TORCHRUN_ENV, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    assert one.launched and one.size == 1, "torchrun with one process still uses the process group (NCCL on a GPU)"
    for broken in ({"RANK": "0"}, {**TORCHRUN_ENV, "RANK": "4"}, {**TORCHRUN_ENV, "WORLD_SIZE": "x"},
                   {**TORCHRUN_ENV, "LOCAL_RANK": "2"}):
        with pytest.raises(ValueError, match="torchrun"):
            World.from_env(broken)


@pytest.mark.parametrize("batch,world", [(32, 2), (5, 2), (7, 3), (3, 3), (10, 4), (1, 1)])
def test_rank_share_covers_the_batch_once_sizes_differ_by_one(batch, world):
    shares = [rank_share(batch, r, world) for r in range(world)]
    covered = [i for s in shares for i in range(batch)[s]]
    assert covered == list(range(batch)), "contiguous, in rank order, every sample exactly once"
    sizes = [s.stop - s.start for s in shares]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True), sizes


def test_epoch_batches_same_global_batches_for_any_number_of_processes():
    n, batch = 103, 10  # 10 global batches of 10, 3 samples dropped (drop_last)
    single = list(EpochBatches(n, batch, seed=4, epoch=2, drop_last=True))
    order = epoch_order(n, 4, 2).tolist()
    assert single == [order[k * batch:(k + 1) * batch] for k in range(10)]
    for world in (2, 3, 4):
        ranks = [list(EpochBatches(n, batch, seed=4, epoch=2, drop_last=True, rank=r, world_size=world))
                 for r in range(world)]
        assert all(len(r) == 10 for r in ranks)
        for k in range(10):  # step k: the ranks' shares put together are the single process's batch k
            assert [i for r in ranks for i in r[k]] == single[k]
        resumed = list(EpochBatches(n, batch, seed=4, epoch=2, drop_last=True, rank=1, world_size=world,
                                    start_batch=6))
        assert resumed == ranks[1][6:], "mid-epoch start with any number of processes"
    with pytest.raises(ValueError, match="进程数"):
        EpochBatches(n, 2, world_size=3)  # a rank would get nothing
    with pytest.raises(ValueError, match="最后一个 batch"):
        EpochBatches(101, 10, world_size=2)  # the last global batch holds 1 sample for 2 ranks
    assert len(list(EpochBatches(102, 10, world_size=2, rank=1))) == 11  # last batch of 2: one sample each


class _WorkerDraw(Dataset):
    """Item i: (i, a number drawn from the worker's torch RNG): what an augmentation using torch.rand sees."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return i, torch.rand(())


def test_loader_worker_seeds_differ_between_ranks_and_rank0_keeps_the_single_process_ones():
    def draws(rank: int, world: int) -> list[float]:
        loader = make_loader(_WorkerDraw(), 4, seed=3, epoch=1, num_workers=1, rank=rank, world_size=world)
        return [v for _, r in loader for v in r.tolist()]
    single, rank0, rank1 = draws(0, 1), draws(0, 2), draws(1, 2)
    assert rank0 == single[:4], "rank 0's worker continues the stream a single process's worker has"
    assert rank1 != rank0 and rank1 == draws(1, 2), "rank 1's worker: its own stream, reproducibly"


def test_single_process_fallbacks():
    """Without a process group every helper gives the one-process answer, touching nothing."""
    assert distributed.any_rank("SIGTERM") is True and distributed.any_rank(None) is False
    assert distributed.from_main(True, 3.5) == (True, 3.5)
    t = torch.tensor(2.0)
    assert distributed.average(t) is t and distributed.broadcast("x") == "x" and distributed.gather(5) == [5]
    distributed.same_on_all_ranks(3, "step")
    before = torch.get_rng_state()
    states = distributed.gather_rng_states()
    assert len(states) == 1 and torch.equal(states[0]["torch"], before)
    distributed.setup(World(), torch.device("cpu"))  # a plain run: no process group
    assert not torch.distributed.is_initialized()
    assert distributed.backend_for(torch.device("cpu")) == "gloo"
    assert distributed.backend_for(torch.device("cuda", 1)) == "nccl"


def test_rank_seed_separates_ranks_and_runs():
    seeds = {distributed.rank_seed(s, r, k) for s in range(3) for r in range(4) for k in (0, 15)}
    assert len(seeds) == 24, "seed + rank would make run 1's rank 0 equal run 0's rank 1"
    assert all(0 <= s < 2**32 for s in seeds)


def _tiny():
    set_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.AdamW(model.parameters())


def test_checkpoint_holds_every_rank_rng_state_and_each_rank_restores_its_own():
    model, optimizer = _tiny()
    single = training_state(model=model, optimizer=optimizer, epoch=0, step=3)
    assert single["world_size"] == 1 and "rng_ranks" not in single, "a single process's layout is unchanged"
    states = []
    for rank in range(3):
        set_seed(100 + rank)
        states.append(rng_state())
    state = training_state(model=model, optimizer=optimizer, epoch=0, step=3, rng_states=states)
    assert state["world_size"] == 3 and state["rng"] is states[0] and state["rng_ranks"] == states
    for rank in range(3):
        set_seed(100 + rank)
        expected = torch.rand(4)  # what rank's stream draws next
        set_seed(999)
        restore_training_state(state, model=model, optimizer=optimizer, rank=rank)
        assert torch.equal(torch.rand(4), expected), f"rank {rank} continues its own stream"
    with pytest.raises(ValueError, match="没有 rank 3"):  # the job grew: never a silent unrestored stream
        restore_training_state(state, model=model, optimizer=optimizer, rank=3)
    restore_training_state(state, model=model, optimizer=optimizer, rank=3, restore_rng=False)


def test_ddp_wrapped_model_is_saved_without_module_prefix():
    """``training_state`` unwraps DDP: its keys carry no ``module.``, so the file loads with or without DDP."""
    model, optimizer = _tiny()
    wrapped = torch.nn.DataParallel(model)  # the same wrapper API as DDP, no process group needed
    assert list(wrapped.state_dict())[0].startswith("module.")
    state = training_state(model=wrapped, optimizer=optimizer, epoch=0, step=1)
    assert list(state["model"]) == list(model.state_dict())
    fresh, fresh_opt = _tiny()
    restore_training_state(state, model=torch.nn.DataParallel(fresh), optimizer=fresh_opt)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe") / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(ROOT / "tests" / "support" / "ddp_probe.py"), str(out)], capture_output=True, text=True,
                          timeout=180, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_gloo_uneven_global_batch_weighting(probe):
    """5 samples on 2 ranks (3 + 2): weighted by share, DDP's gradient is the global batch's (float64)."""
    uneven = probe["uneven"]
    assert uneven["shares"] == [3, 2]
    assert uneven["weighted"] < 1e-12
    assert uneven["unweighted"] > 1e-3, "without the weights the small share counts too much"


@pytest.mark.slow
def test_gloo_rng_streams(probe):
    streams = probe["streams"]
    assert streams["same_seed_equal"], "one seed on every rank: identical dropout masks (the classic mistake)"
    assert not streams["seed_rank_equal"] and streams["reproducible"]


@pytest.mark.slow
def test_gloo_exact_resume_needs_own_rng_and_the_same_file(probe):
    resume = probe["resume"]
    assert resume["script"] == {"losses_equal": [True, True], "params_equal": True, "ranks_agree": True}
    assert resume["rank0_rng_everywhere"]["losses_equal"] == [False, False], \
        "rank 1 replays rank 0's dropout masks: the averaged gradient, hence every rank, drifts"
    for wrong in ("only_rank0_loads_after_wrap", "rank1_older_file"):
        assert not resume[wrong]["ranks_agree"], f"{wrong}: the ranks' weights drift apart silently"


@pytest.mark.slow
def test_gloo_agreement_helpers(probe):
    for rank, got in enumerate(probe["agreement"]):
        assert got["any_rank_1_only"] is True and got["any_rank_none"] is False
        assert got["from_main"] == [True, 10.0] and got["broadcast"] == "from rank 0"
        assert got["gather"] == [0, 10] and got["average"] == 0.5
        assert got["rng_states"] == (2 if rank == 0 else None)
        assert "rank 0: 0, rank 1: 1" in got["disagree_raises"]
