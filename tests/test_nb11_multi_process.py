"""The exercises of 11_multi_process: what is special to their checks (any balanced partition passes, the course's
rule, the generators left alone). The contract (solution passes, stub fails, hints, every typical wrong answer
of tests/support/wrong_answers/nb11.py fails with its fragment, demo cells) is in tests/test_exercise_contracts.py, its
50-seed sweep in tests/test_exercise_sweeps.py.
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

from course_tools.checks.nb11_multi_process import check_rank_batch, check_strip_module_prefix
from tests.support.notebook_cells import ROOT, authored_code_lines, exercise_pairs, run_source
from tests.support.sweep import failure_twice
from tests.support.wrong_answers.nb11 import _ORDER, WRONG_PREFIX, WRONG_SHARE

NAME = "11_multi_process.ipynb"

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
