"""claim(): strict under the test suite, a gentle note in a learner's notebook, JSON lines in record mode."""
import json

import numpy as np
import pytest

from course_tools import claims


def test_claim_passes_quietly(capsys):
    assert claims.claim(2 > 1, "2 大于 1", a=2, b=1) is True
    assert capsys.readouterr().out == ""


def test_false_claim_raises_under_the_suite(monkeypatch):
    monkeypatch.setenv("COURSE_CLAIMS", "strict")
    with pytest.raises(claims.ClaimFailed, match=r"正文的说法与本次输出不符: EMA 更好\(ema=0.38, raw=0.41\)"):
        claims.claim(False, "EMA 更好", ema=0.38, raw=0.41)


def test_false_claim_prints_a_note_for_learners(monkeypatch, capsys):
    monkeypatch.delenv("COURSE_CLAIMS", raising=False)
    assert claims.claim(False, "loss 在下降", first=2.308, last=2.309) is False
    out = capsys.readouterr().out
    assert "loss 在下降" in out and "first=2.308" in out and "Error" not in out


def test_the_suite_runs_strict():
    assert claims.is_strict(), "conftest.py must set COURSE_CLAIMS=strict for the notebooks under nbval"


def test_record_mode_appends_each_claim_and_never_raises(monkeypatch, tmp_path, capsys):
    path = tmp_path / "claims.jsonl"
    monkeypatch.setenv("COURSE_CLAIMS", f"record:{path}")
    assert not claims.is_strict() and claims.record_path() == path
    assert claims.claim(np.float64(0.02) > 0.14, "异步更快", sync=np.float64(0.14), asynchronous=0.02, gaps=[1, 2]) is False
    assert claims.claim(True, "异步更快", sync=0.1, asynchronous=0.05, n=3) is True
    assert capsys.readouterr().out == ""
    first, second = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert first["statement"] == "异步更快" and first["id"] == second["id"] and len(first["id"]) == 12
    assert first["holds"] is False and second["holds"] is True
    assert first["values"] == {"sync": 0.14, "asynchronous": 0.02, "gaps": "[1, 2]"} and second["values"]["n"] == 3
