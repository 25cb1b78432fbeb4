"""The exercises of 11_multi_process: each check accepts the solution and rejects typical wrong answers.

Each wrong answer below is a mistake a learner plausibly makes (commented); the check must
fail on every one with its default seed and, in the slow sweep, with 50 other seeds.
The notebook's two-process launcher (course_tools.lab.multi_process.run_ranks) is tested too: a failing rank is reported with
its traceback and takes the other rank down, and a hung job ends at its timeout.
"""
from __future__ import annotations

import ast
import os
import time
from pathlib import Path

import nbformat
import pytest

from course_tools.checks import CheckFailed
from course_tools.checks.nb11_multi_process import check_rank_batch, check_strip_module_prefix
from tests.exercise_isolation import demo_cells_using_exercises
from tests.notebook_cells import ROOT, answer_lines_in, authored_code_lines, exercise_pairs, run_source, stub_hints
from tests.sweep import SWEEP_SEEDS, failure_twice

NAME = "11_multi_process.ipynb"

_ORDER = "import torch\nfrom course_utils.data import epoch_order\n"

# name -> (source, a fragment the failure message must contain)
WRONG_SHARE = {
    # no sharding: every rank trains on the whole global batch (the plain single-process loop, copied)
    "whole global batch on every rank": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    return epoch_order(n, seed, epoch)[step * global_batch:(step + 1) * global_batch].tolist()
''', "整个全局 batch"),
    # a per-rank batch size, but the rank is never used: every rank takes the same slice
    "rank never used": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    b = global_batch // world_size
    return epoch_order(n, seed, epoch)[step * b:(step + 1) * b].tolist()
''', "同样的"),
    # "each rank its own seed" applied to the data order: the ranks' orders differ, shares overlap and miss
    "rank in the data seed": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    batch = epoch_order(n, seed + rank, epoch)[step * global_batch:(step + 1) * global_batch]
    return batch.tensor_split(world_size)[rank].tolist()
''', "种子里也不要加 rank"),
    # the epoch is forgotten: the same order every epoch (DistributedSampler without set_epoch)
    "epoch forgotten": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    batch = epoch_order(n, seed, 0)[step * global_batch:(step + 1) * global_batch]
    return batch.tensor_split(world_size)[rank].tolist()
''', "set_epoch"),
    # positions in the epoch instead of the sample ids found there
    "positions instead of sample ids": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    batch = torch.arange(n)[step * global_batch:(step + 1) * global_batch]
    return batch.tensor_split(world_size)[rank].tolist()
''', "位置"),
    # DistributedSampler's way: shard the whole epoch first, then a per-rank batch of B // W
    "epoch sharded first, then B // W per rank": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    b = global_batch // world_size
    mine = epoch_order(n, seed, epoch)[rank::world_size]
    return mine[step * b:(step + 1) * b].tolist()
''', "漏了"),
    # torch.chunk: sizes are ceil(B / W) and some batches give fewer than W pieces
    "torch.chunk": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    batch = epoch_order(n, seed, epoch)[step * global_batch:(step + 1) * global_batch]
    return batch.chunk(world_size)[rank].tolist()
''', "IndexError"),
    # floor division: the remainder of a global batch that W does not divide is never trained on
    "B // W, remainder dropped": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    b = global_batch // world_size
    start = step * global_batch + rank * b
    return epoch_order(n, seed, epoch)[start:start + b].tolist()
''', "B // W"),
    # ceiling division: the last rank reaches into the next global batch
    "ceil(B / W), past the batch's end": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    b = -(-global_batch // world_size)
    start = step * global_batch + rank * b
    return epoch_order(n, seed, epoch)[start:start + b].tolist()
''', "末尾"),
    # drop_last: the short last global batch is skipped, its samples never seen this epoch
    "short last batch skipped": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    if (step + 1) * global_batch > n:
        return []
    batch = epoch_order(n, seed, epoch)[step * global_batch:(step + 1) * global_batch]
    return batch.tensor_split(world_size)[rank].tolist()
''', "最后一个不满"),
    # a fresh shuffle from the global generator on every call: ranks (and calls) disagree
    "global torch.randperm": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    batch = torch.randperm(n)[step * global_batch:(step + 1) * global_batch]
    return batch.tensor_split(world_size)[rank].tolist()
''', "全局随机数"),
    # a home-made (seed, epoch) shuffle instead of the course's epoch_order: not the script's global batches
    "own shuffle instead of epoch_order": ('''
import random
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    order = list(range(n))
    random.Random(seed * 1000 + epoch).shuffle(order)
    batch = order[step * global_batch:(step + 1) * global_batch]
    k, r = divmod(len(batch), world_size)
    start = rank * k + min(rank, r)
    return batch[start:start + k + (rank < r)]
''', "epoch_order"),
    # returns a float tensor (e.g. after mixing with a float computation)
    "float tensor": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    batch = epoch_order(n, seed, epoch)[step * global_batch:(step + 1) * global_batch].float()
    return batch.tensor_split(world_size)[rank]
''', "整数"),
}

WRONG_PREFIX = {
    # str.replace also removes "module." inside a key (head_module.weight -> head_weight)
    "str.replace": ('''
def strip_module_prefix(state_dict):
    return {k.replace("module.", ""): v for k, v in state_dict.items()}
''', "str.replace"),
    # replace once: right for DDP's keys, but breaks a plain key with "module." inside
    "str.replace once, on every key": ('''
def strip_module_prefix(state_dict):
    return {k.replace("module.", "", 1): v for k, v in state_dict.items()}
''', "原样保留"),
    # str.lstrip strips a set of characters (embed.weight -> bed.weight)
    "str.lstrip": ('''
def strip_module_prefix(state_dict):
    return {k.lstrip("module."): v for k, v in state_dict.items()}
''', "lstrip"),
    # always cuts 7 characters, prefix or not
    "k[7:] on every key": ('''
def strip_module_prefix(state_dict):
    return {k[7:]: v for k, v in state_dict.items()}
''', "原样保留"),
    # drops the first dotted component of every key
    "split on the first dot": ('''
def strip_module_prefix(state_dict):
    return {k.split(".", 1)[1]: v for k, v in state_dict.items()}
''', "原样保留"),
    # keeps only the prefixed keys: a plain state_dict comes back empty
    "filters instead of keeping": ('''
def strip_module_prefix(state_dict):
    return {k[len("module."):]: v for k, v in state_dict.items() if k.startswith("module.")}
''', "空字典"),
    # strips every leading "module.", also the model's own child called module
    "strips repeatedly": ('''
def strip_module_prefix(state_dict):
    out = {}
    for k, v in state_dict.items():
        while k.startswith("module."):
            k = k[len("module."):]
        out[k] = v
    return out
''', "一层"),
    # torch's helper edits the dict in place (and returns None)
    "consume_prefix_in_state_dict_if_present, in place": ('''
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
def strip_module_prefix(state_dict):
    consume_prefix_in_state_dict_if_present(state_dict, "module.")
    return state_dict
''', "原地修改"),
    # pops and re-inserts in the caller's dict
    "renames keys in the caller's dict": ('''
def strip_module_prefix(state_dict):
    for k in list(state_dict):
        if k.startswith("module."):
            state_dict[k[len("module."):]] = state_dict.pop(k)
    return state_dict
''', "被改动"),
    # returns the new key names only
    "returns the keys": ('''
def strip_module_prefix(state_dict):
    return [k.removeprefix("module.") for k in state_dict]
''', "字典"),
    # clones and zero-fills "to be safe": the weights are lost
    "new tensors instead of the values": ('''
import torch
def strip_module_prefix(state_dict):
    return {k.removeprefix("module."): torch.zeros_like(v) for k, v in state_dict.items()}
''', "值"),
}

EXERCISES = {  # function name -> (check, wrong answers)
    "rank_batch": (check_rank_batch, WRONG_SHARE),
    "strip_module_prefix": (check_strip_module_prefix, WRONG_PREFIX),
}


@pytest.fixture(scope="module")
def pairs() -> dict[str, tuple[str, str]]:
    """Function name -> (solution source, released stub source)."""
    found = {}
    for solved, stub in exercise_pairs(NAME):
        names = [n.name for n in ast.parse(solved).body if isinstance(n, ast.FunctionDef)]
        assert len(names) == 1, names
        found[names[0]] = (solved, stub)
    assert set(found) == set(EXERCISES)
    return found


@pytest.mark.parametrize("name", list(EXERCISES))
def test_solution_passes(pairs, name, capsys):
    check, _ = EXERCISES[name]
    check(run_source(pairs[name][0])[name])
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(EXERCISES))
def test_stub_fails_with_not_implemented_message(pairs, name):
    check, _ = EXERCISES[name]
    with pytest.raises(CheckFailed, match="练习尚未完成"):
        check(run_source(pairs[name][1])[name])


@pytest.mark.parametrize("name", list(EXERCISES))
def test_stub_hint_contains_no_line_of_the_answer(pairs, name):
    solution, stub = pairs[name]
    hints = stub_hints(stub)
    assert len(hints) == 1
    assert not answer_lines_in(hints[0], solution), answer_lines_in(hints[0], solution)


@pytest.mark.parametrize("name,wrong", [(n, w) for n, (_, ws) in EXERCISES.items() for w in ws])
def test_wrong_answers_fail(name, wrong):
    check, answers = EXERCISES[name]
    source, fragment = answers[wrong]
    with pytest.raises(CheckFailed) as info:
        check(run_source(source)[name])
    assert fragment in str(info.value), str(info.value)


def test_any_balanced_partition_passes(capsys):
    """Every W-th sample of the global batch is as right as contiguous slices: the check tests properties."""
    strided = run_source(_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    return epoch_order(n, seed, epoch)[step * global_batch:(step + 1) * global_batch][rank::world_size].tolist()
''')["rank_batch"]
    check_rank_batch(strided)
    assert "✅" in capsys.readouterr().out


def test_solution_matches_the_course_rule(pairs):
    """The notebook's answer gives each rank the share course_utils.data (the professional script) gives it."""
    from course_utils.data import epoch_order, rank_share
    solution = run_source(pairs["rank_batch"][0])["rank_batch"]
    for n, b, w in ((47, 12, 2), (29, 11, 4)):
        order = epoch_order(n, 3, 1)
        for step in range(-(-n // b)):
            batch = order[step * b:(step + 1) * b]
            for rank in range(w):
                assert solution(n, b, 3, 1, step, rank, w) == batch[rank_share(len(batch), rank, w)].tolist()


def test_checks_are_deterministic_and_leave_the_generators_alone():
    import torch
    for name, (check, answers) in EXERCISES.items():
        fn = run_source(next(iter(answers.values()))[0])[name]
        torch.manual_seed(5)
        expected = torch.rand(3)
        torch.manual_seed(5)
        failure_twice(check, fn)
        assert torch.equal(torch.rand(3), expected), name


def test_demo_cells_never_call_an_exercise():
    assert demo_cells_using_exercises(NAME) == []


# ---------------------------------------------------------------- the notebook's launcher

@pytest.fixture(scope="module")
def launcher() -> dict:
    """The notebook's launcher (course_tools.lab.multi_process), after the notebook's setup and launcher cells ran here."""
    from course_tools.lab import multi_process

    cells = {c.id: c.source for c in nbformat.read(ROOT / "solutions" / NAME, as_version=4).cells}
    namespace = run_source(cells["setup"])
    exec(compile(cells["launcher"], "<launcher>", "exec"), namespace)  # its demo call: hello on two ranks
    assert namespace["run_ranks"] is multi_process.run_ranks
    yield vars(multi_process)
    multi_process.cleanup()


def _children() -> set[int]:
    """Live (not zombie) child processes of this test process."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        if f"PPid:\t{os.getpid()}\n" in status and "State:\tZ" not in status:
            found.add(int(entry.name))
    return found


def _rank_fails(rank, world_size):
    import torch.distributed as dist
    if rank == 1:
        raise ValueError("rank 1 gives up")
    dist.barrier()  # rank 0 would wait here for ever


def test_launcher_reports_a_failed_rank_and_stops_the_others(launcher):
    if launcher["CTX"] is None:
        pytest.skip("no fork on this platform")
    before = _children()
    with pytest.raises(RuntimeError, match=r"rank 1 出错\(退出码 1\)(?s:.*)rank 1 gives up"):
        launcher["run_ranks"](_rank_fails, timeout=60)
    assert _children() - before == set()


def _rank_hangs(rank, world_size):
    time.sleep(600)


def test_launcher_timeout_kills_a_hung_job(launcher):
    if launcher["CTX"] is None:
        pytest.skip("no fork on this platform")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="2 s 内没有结束"):
        launcher["run_ranks"](_rank_hangs, timeout=2)
    assert time.monotonic() - start < 20


@pytest.mark.slow
def test_verdicts_do_not_depend_on_the_seed(pairs, workbook_threads):
    for name, (check, answers) in EXERCISES.items():
        solution = run_source(pairs[name][0])[name]
        wrong = {w: run_source(source)[name] for w, (source, _) in answers.items()}
        for seed in SWEEP_SEEDS:
            check(solution, seed=seed)
            for w, fn in wrong.items():
                with pytest.raises(CheckFailed):
                    check(fn, seed=seed)


def test_learner_copy_shows_at_most_420_lines_of_code():
    """Launchers, timing choreography and bookkeeping live in course_tools.lab.multi_process and .hangs (issue 20:
    350 lines for §1-9; §10, a hang, adds its measurements and claims: 420)."""
    nb = nbformat.read(ROOT / "notebooks" / NAME, as_version=4)
    lines = authored_code_lines(nb)
    assert lines <= 420, lines


def test_the_deliberate_spawn_failure_is_caught_not_a_raw_traceback():
    """Section 1's spawn child fails on purpose: its error is caught and printed as one explained line."""
    nb = nbformat.read(ROOT / "solutions" / NAME, as_version=4)
    spawn = next(c for c in nb.cells if c.id == "spawn")
    assert "spawn_outcome(notebook_function)" in spawn.source
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.output_type != "error", cell.id
            if out.output_type == "stream":
                assert out.name == "stdout" and "Traceback" not in out.text, cell.id
    printed = "".join(out.text for out in spawn.outputs if out.output_type == "stream")
    assert "AttributeError: Can't get attribute 'notebook_function'" in printed
