"""00_start_here: the orientation notebook says what a newcomer needs and its learner copy is current."""
from __future__ import annotations

import re

import nbformat

from course_tools.release import render
from tests.notebook_cells import ROOT, tagged_sources

NAME = "00_start_here.ipynb"
SOLVED = ROOT / "solutions" / NAME


def _text(cell_type: str) -> str:
    nb = nbformat.read(SOLVED, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == cell_type)


def test_no_exercises_and_learner_copy_is_current():
    assert tagged_sources(SOLVED, "exercise") == []
    learner = ROOT / "notebooks" / NAME
    assert learner.read_text(encoding="utf-8") == render(SOLVED), "notebooks/ 已过期: 运行 python -m course_tools.release"


def test_chapter_map_lists_01_to_10():
    prose = _text("markdown")
    rows = re.findall(r"^\| (\d\d) \|", prose, flags=re.M)
    assert rows == [f"{i:02d}" for i in range(1, 11)]


def test_explains_fast_mode_and_real_data():
    prose = _text("markdown")
    for needle in ("COURSE_FAST=1", "data/cifar-10-batches-py", "COURSE_DATA", "solutions/", "notebooks/", "✅"):
        assert needle in prose, needle


def test_uses_the_helpers_it_promises():
    source = _text("code")
    for needle in ("environment_table(", "load_cifar10(", ".source", "show_samples(", "from tqdm.auto import tqdm",
                   "build_model(\"small\"", "assert test_acc > chance"):
        assert needle in source, needle
