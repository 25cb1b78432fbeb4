"""The LMS gradebook export (canvas, moodle, xlsx) from a small grades.csv, and ``--only`` regrading.

No kernel runs here: the export reads a report written by :class:`Report`; ``--only`` fakes the one
per-learner grading step at the pipeline seam (``pipeline.grade_item``) on the tiny fixture references.
"""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
from openpyxl import load_workbook

import course_grader as grade
from course_grader import pipeline
from course_grader.export import gradebook, layout, read_roster, RosterError
from course_grader.report import CheckOutcome, Grade, Report, load_report

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "grading" / "solutions"
HOSTILE = '=HYPERLINK("http://evil","x")'
NB1, NB2 = "01_fixture.ipynb", "02_fixture.ipynb"


def _report(tmp_path: Path) -> Path:
    path = tmp_path / "grades.csv"
    report = Report(path)
    rows = [Grade("sec2/bob", NB1, 1, 2, checks=[CheckOutcome("a", True), CheckOutcome("b", False, "x")]),
            Grade("sec2/bob", NB2, 2, 2, checks=[CheckOutcome("c", True), CheckOutcome("d", True)]),
            Grade(HOSTILE, NB1, 2, 2, checks=[CheckOutcome("a", True), CheckOutcome("b", True)])]
    for g in rows:
        report.add(g)
    report.finish(report.grades)
    return path


def _roster(tmp_path: Path) -> Path:
    path = tmp_path / "roster.csv"
    path.write_text("learner,name,id,login,email,section\n"
                    "sec2/bob,Bob Li,1001,bob,bob@example.edu,sec2\n"
                    "carol,=cmd|' /C calc'!A0,1002,carol,carol@example.edu,sec1\n", encoding="utf-8")
    return path


def test_canvas_and_moodle_rows_columns_total_and_unmatched(tmp_path):
    book = gradebook(load_report(_report(tmp_path)), read_roster(_roster(tmp_path)))
    assert book.assignments == ["01_fixture", "02_fixture"]
    canvas = layout(book, "canvas")
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "01_fixture", "02_fixture",
                         "Final Score"]
    rows = {r[0]: r for r in canvas[1:]}
    assert rows["Bob Li"] == ["Bob Li", "1001", "", "bob", "sec2", 50.0, 100.0, 75.0]   # 3 of 4 checks
    assert rows["'" + HOSTILE][5:] == [100.0, "", 100.0]          # not on the roster: kept, its empty notebook too
    assert rows["'=cmd|' /C calc'!A0"][5:] == [0.0, 0.0, 0.0]       # on the roster, nothing handed in: kept, 0
    assert sorted(book.unmatched) == ["不在花名册里(LMS 标识留空): '" + HOSTILE, "花名册里有、但没有任何提交(记 0 分): carol"]
    moodle = layout(book, "moodle")
    assert moodle[0] == ["Full name", "ID number", "Email address", "01_fixture", "02_fixture", "Total"]
    assert ["Bob Li", "1001", "bob@example.edu", 50.0, 100.0, 75.0] in moodle


def test_cli_writes_csv_and_xlsx_with_no_live_formula(tmp_path, capsys):
    report, roster = _report(tmp_path), _roster(tmp_path)
    assert grade.main(["export", str(report), "--format", "canvas", "--roster", str(roster)]) == 0
    out = capsys.readouterr().out
    assert "carol" in out and HOSTILE in out
    with open(tmp_path / "grades.canvas.csv", newline="", encoding="utf-8") as f:
        cells = [c for row in csv.reader(f) for c in row]
    assert len(cells) == 8 * 4 and not any(c.startswith(("=", "+", "-", "@")) for c in cells)
    assert grade.main(["export", str(report), "--format", "xlsx", "--roster", str(roster)]) == 0
    sheet = load_workbook(tmp_path / "grades.xlsx").active
    values = [[c.value for c in row] for row in sheet.iter_rows()]
    assert values[0] == ["学员文件夹", "姓名", "学号", "邮箱", "班级", "01_fixture (%)", "02_fixture (%)", "总分 (%)"]
    assert len(values) == 4 and ["sec2/bob", "Bob Li", "1001", "bob@example.edu", "sec2", 50, 100, 75] in values
    texts = [c for row in sheet.iter_rows() for c in row if isinstance(c.value, str)]
    assert all(c.data_type == "s" and not c.value.startswith("=") for c in texts)


def test_bad_roster_or_report_is_one_chinese_line_and_exit_2(tmp_path, capsys):
    report = _report(tmp_path)
    (tmp_path / "no_learner.csv").write_text("name,email\nBob,b@x\n", encoding="utf-8")
    (tmp_path / "twice.csv").write_text("learner\nbob\nbob\n", encoding="utf-8")
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00\x81garbage")
    for roster in ("no_learner.csv", "twice.csv", "binary.csv", "absent.csv"):
        with pytest.raises(RosterError):
            read_roster(tmp_path / roster)
        assert grade.main(["export", str(report), "--format", "moodle", "--roster", str(tmp_path / roster)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("无法导出") and "\n" not in err, err
    assert grade.main(["export", str(tmp_path / "none.csv"), "--format", "xlsx"]) == 2


# ---------------------------------------------------------------- --only

def _class(tmp_path: Path) -> Path:
    for learner in ("sec1/alice", "sec2/bob", "sec2/carol"):   # learners sit at one depth (collect)
        folder = tmp_path / "class" / learner
        folder.mkdir(parents=True)
        (folder / NB1).write_text("{}", encoding="utf-8")     # the fake grader never reads it
    return tmp_path / "class"


def _fake_grader(monkeypatch, version: str) -> None:
    async def fake(item, released, options, private):
        return Grade(item.learner, item.reference.name, 1, 2, [f"{version} {item.learner}"],
                     checks=[CheckOutcome("check-add", True), CheckOutcome("check-square", False, version)])
    monkeypatch.setattr(pipeline, "grade_item", fake)


def _lines(path: Path, learner: str) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith(learner + ",")]


def test_only_regrades_those_learners_and_keeps_the_others_byte_identical(tmp_path, monkeypatch, capsys):
    submissions, report = _class(tmp_path), tmp_path / "out" / "grades.csv"
    args = [str(submissions), "--report", str(report), "--solutions", str(FIXTURE), "--no-sandbox", "--no-homework"]
    _fake_grader(monkeypatch, "first")
    assert grade.main(args) == 0
    checks = report.with_name("grades.checks.csv")
    before = {p: {n: _lines(p, n) for n in ("sec1/alice", "sec2/bob", "sec2/carol")} for p in (report, checks)}
    _fake_grader(monkeypatch, "second")
    assert grade.main(args + ["--only", "sec1/alice,sec2/bob"]) == 0
    for path in (report, checks):
        assert _lines(path, "sec2/carol") == before[path]["sec2/carol"] and before[path]["sec2/carol"]
        for name in ("sec1/alice", "sec2/bob"):
            assert _lines(path, name) != before[path][name] and len(_lines(path, name)) == len(before[path][name])
    assert {g.notes[0] for g in load_report(report)} == {"second sec1/alice", "second sec2/bob", "first sec2/carol"}
    assert "second" in (report.parent / "grades_feedback" / "sec2__bob.html").read_text(encoding="utf-8")
    capsys.readouterr()
    assert grade.main(args + ["--only", "sec1/alice,nobody"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "--only: 提交文件夹里没有学员 nobody"
    assert {g.notes[0] for g in load_report(report)} == {"second sec1/alice", "second sec2/bob", "first sec2/carol"}
