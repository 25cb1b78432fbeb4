"""bench/claims_under_load.py without a run: which notebooks it picks, where it stops, how it counts claims.

The bench itself (notebooks executed ten times beside CPU hogs) is run by hand: its command is in its docstring.
"""
from __future__ import annotations

import json

import pytest

from tests.support.bench_scripts import load


@pytest.fixture(scope="module")
def bench():
    return load("claims_under_load")


def test_prefixes_pick_notebooks(bench):
    assert [(p.name, cell) for p, cell in bench.notebooks(["08_"])] == [("08_time_estimate.ipynb", None)]
    assert [(p.name, cell) for p, cell in bench.notebooks(["08", "04:36"])] == [
        ("04_checkpoint_resume.ipynb", 36), ("08_time_estimate.ipynb", None), ("08b_flops_memory.ipynb", None)]
    with pytest.raises(SystemExit):
        bench.notebooks(["99"])


def test_stops_after_the_last_claim_cell(bench):
    cells = [{"cell_type": "code", "source": "from course_tools.claims import claim"},
             {"cell_type": "code", "source": ["x = 1\n", "_ = claim(x > 0, 'x 为正', x=x)"]},
             {"cell_type": "markdown", "source": "claim(这里不是代码)"},
             {"cell_type": "code", "source": "print(x)"}]
    assert bench.last_claim_cell(cells) == 1
    assert bench.last_claim_cell(cells[:1]) == -1


def test_records_and_summary(bench, tmp_path):
    lines = [{"id": "a", "statement": "异步更快", "holds": True, "values": {"sync": 0.3, "asynchronous": 0.1}},
             {"id": "b", "statement": "间隔", "holds": False, "values": {"gaps": "[0.3, 0.4]"}}]
    record = tmp_path / "run.jsonl"
    record.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines) + '{"id": "a", "stat',
                      encoding="utf-8")  # the last line cut short, as by a killed kernel
    first = bench.read_records(record)
    assert first == lines and bench.read_records(tmp_path / "missing.jsonl") == []
    second = [{**lines[0], "holds": False, "values": {"sync": 0.5, "asynchronous": 0.6}}]
    rows = bench.summarize([{"claims": first}, {"claims": second}, {"claims": [lines[0]]}])
    assert [(r["id"], r["held"], r["n"]) for r in rows] == [("a", 2, 3), ("b", 0, 1)]
    assert rows[0]["values"]["sync"] == {"min": 0.3, "median": 0.3, "max": 0.5}
    assert rows[0]["values"]["asynchronous"] == {"min": 0.1, "median": 0.1, "max": 0.6}
    assert rows[1]["values"] == {}  # a value given as text has no spread
    shown = bench.table({"04_checkpoint_resume": {"claims": rows}})
    assert "| 04 异步更快 " in shown and " 2/3 |" in shown and "sync 0.3/0.3/0.5, asynchronous 0.1/0.1/0.6 |" in shown
