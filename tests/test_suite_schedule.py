"""The suite's schedule: pytest-xdist hands its workers whole files in the root conftest's order (longest first)."""
from __future__ import annotations

from types import SimpleNamespace

from xdist.scheduler import LoadFileScheduling


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
