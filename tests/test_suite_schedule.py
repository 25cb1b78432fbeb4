"""The suite's schedule: pytest-xdist hands its workers whole files in the root conftest's order (longest first)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from xdist.scheduler import LoadFileScheduling

import conftest  # the root conftest: its file order


class _Worker:
    """What the scheduler needs of a worker: it records the test indices sent to it."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[list[int]] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(list(indices))

    def shutdown(self) -> None:
        self.shutting_down = True


class _Config:
    """The session's own parsed options (``addopts`` from pyproject.toml), with two workers."""

    def __init__(self, option) -> None:
        self.option = option

    def getvalue(self, name: str):
        return ["popen", "popen"] if name == "tx" else getattr(self.option, name)


def test_workers_get_the_files_in_the_conftest_order(request):
    # By default pytest-xdist re-sorts the files by their number of tests (--loadscope-reorder), which undid
    # the longest-first order: the 316 quick contract tests went first and a 90 s file started in the last minutes.
    collection = ["a_long.py::t1",                                  # the conftest put the longest file first
                  "b_medium.py::t1", "b_medium.py::t2",
                  "c_short.py::t1", "c_short.py::t2", "c_short.py::t3"]
    scheduler = LoadFileScheduling(_Config(request.config.option))
    workers = [_Worker("gw0"), _Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    first = [collection[w.sent[0][0]].split("::")[0] for w in workers]
    assert first == ["a_long.py", "b_medium.py"], first



class _Item:
    """What ``conftest.file_costs`` reads of a collected test: its file, its name, its slow mark."""

    def __init__(self, path: str, name: str, slow: bool = False) -> None:
        self.fspath, self.name, self.slow = conftest.ROOT / path, name, slow

    def get_closest_marker(self, name: str) -> bool | None:
        return (name == "slow" and self.slow) or None


def test_a_long_test_moved_to_a_file_of_its_own_keeps_its_place_before_the_next_measurement():
    # the sweeps were one file (one worker); the resume doctor's sweep moved out so that another worker runs it
    files = {"tests/sweeps.py": 800.0, "tests/unit.py": 2.0, "solutions/13.ipynb": 280.0}
    tests = {"tests/sweeps.py::sweep[13]": 400.0, "tests/sweeps.py::sweep[07]": 115.0,
             "solutions/13.ipynb::Cell 3": 116.0, "solutions/04.ipynb::Cell 3": 40.0}
    items = [_Item("tests/sweeps.py", "sweep[07]", slow=True), _Item("tests/sweeps_processes.py", "sweep[13]", slow=True),
             _Item("tests/unit.py", "test_a"), _Item("tests/new.py", "test_b", slow=True), _Item("tests/new.py", "test_c"),
             _Item("solutions/13.ipynb", "Cell 3"), _Item("solutions/new.ipynb", "Cell 3")]
    cost = {Path(path).relative_to(conftest.ROOT).as_posix(): seconds
            for path, seconds in conftest.file_costs(items, files, tests).items()}
    assert cost == {"tests/sweeps.py": 800.0,             # measured as a file (the part that left is not subtracted)
                    "tests/sweeps_processes.py": 400.0,   # its one test, measured under another file
                    "tests/unit.py": 2.0,
                    "tests/new.py": 800.0 + 60.0,         # nothing measured: first, guessed from its slow test
                    "solutions/13.ipynb": 280.0,
                    "solutions/new.ipynb": 800.0 + 10.0}  # "Cell 3" was measured in two notebooks: not its own
