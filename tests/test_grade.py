"""The instructor grader's parts, on the tiny reference notebooks in tests/fixtures/grading/solutions/.

01_fixture has two exercises (add, square), each followed by a check cell, plus a solution-only
cell; 02_fixture has the self-test answers (scored outside the kernel) and a cube exercise.
Collection, merging, the tamper scan, the literal answers and the reports are tested without a
kernel; a few kernels test the sandbox's time limits, ``--no-sandbox`` and ``--resume``. The
hostile class (every attack at once, one grader call) is in tests/test_grade_hostile.py.
"""
from __future__ import annotations

import asyncio
import codecs
import copy
import csv
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

import course_grader as grade
from course_grader import sandbox
from course_tools import cputime
from course_grader import kernel as grade_kernel, plan as grade_plan, report as grade_report
from course_grader.answers import LiteralError, OutsideCheck, literal_return, outside_check, score_outside
from course_grader.collect import collect
from course_grader.kernel import Budget, run_cells
from course_grader.pipeline import _shard as pipeline_shard
from course_grader.plan import UnreadableNotebook, read_notebook
from course_grader.report import CheckOutcome, Grade, Report, load_report, merge_reports, safe_field
from course_grader.scan import scan
from course_tools.release import learner_notebook

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "grading" / "solutions"
NAME, NAME2 = "01_fixture.ipynb", "02_fixture.ipynb"


def _ref(name: str = NAME) -> nbformat.NotebookNode:
    return nbformat.read(FIXTURE / name, as_version=4)


def _cell(nb, cell_id):
    return next(c for c in nb.cells if c.get("id") == cell_id)


def _write(folder: Path, nb, name: str = NAME) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / name)
    return folder / name


def _solved_add_only():
    nb = learner_notebook(_ref())
    _cell(nb, "ex-add").source = "def add(a, b):\n    return a + b"
    return nb


@pytest.fixture(scope="module")
def sandbox_ok():
    """Skip (naming the package) only where bubblewrap is not installed; a sandbox that fails to start fails."""
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap (Debian package 'bubblewrap', command bwrap)")
    sandbox.check_available()


# ---------------------------------------------------------------- merging

def test_merge_takes_only_exercise_sources_from_the_learner():
    released = learner_notebook(_ref())
    sub = learner_notebook(_ref())
    _cell(sub, "ex-add").source = "def add(a, b):\n    return 0"
    _cell(sub, "ex-add").metadata["tags"] = ["exercise", "nbval-skip"]  # tags are not taken over
    _cell(sub, "check-add").source = "pass"
    sub.cells.insert(0, nbformat.v4.new_code_cell("import os"))         # extra cells are ignored
    merged, notes = grade_plan.merge_exercises(released, sub)
    assert notes == []
    assert _cell(merged, "ex-add").source.endswith("return 0")
    assert _cell(merged, "ex-add").metadata["tags"] == ["exercise"]
    assert _cell(merged, "check-add").source == _cell(_ref(), "check-add").source
    assert "NotImplementedError" in _cell(merged, "ex-square").source    # learner's stub kept
    assert all(c.get("id") != "sol-only" for c in merged.cells)         # solution-only cells dropped


def test_merge_matches_untagged_or_renamed_cells_by_function_name_then_order():
    released = learner_notebook(_ref())
    sub = copy.deepcopy(_ref())
    for c in sub.cells:
        c.id = "x" + c.id                          # ids changed (another copy of the notebook)
    _cell(sub, "xex-square").metadata = {}         # tag lost
    merged, notes = grade_plan.merge_exercises(released, sub)
    assert "return x * x" in _cell(merged, "ex-square").source and "return a + b" in _cell(merged, "ex-add").source
    assert any("按函数名匹配 2 个" in n for n in notes), notes


def test_merge_survives_malformed_cells():
    released = learner_notebook(_ref())
    sub = nbformat.from_dict({"cells": [{"cell_type": "code", "id": ["x"], "metadata": [], "source": 5},
                                        {"cell_type": "code", "metadata": {"tags": "exercise"}, "source": ["def add"]}],
                              "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    merged, notes = grade_plan.merge_exercises(released, sub)
    assert "未找到练习 [1, 2]" in notes[0]
    assert "NotImplementedError" in _cell(merged, "ex-add").source


def test_plan_knows_checks_owners_and_outside_checks():
    plan = grade_plan.make_plan(learner_notebook(_ref(NAME2)), _ref(NAME2))
    assert [plan.label(i) for i in plan.checks] == ["check-answers", "check-cube"]
    assert [plan.owner[i] for i in plan.checks] == plan.exercises
    assert list(plan.outside) == plan.checks[:1]
    assert plan.outside[plan.checks[0]] == OutsideCheck("course_tools.checks.nb09_self_test", "check_self_test_answers",
                                                         "self_test_answers")
    assert plan.flags == {}


# ---------------------------------------------------------------- collecting

def test_collect_every_learner_gets_a_row_per_graded_notebook(tmp_path):
    refs = [FIXTURE / NAME, FIXTURE / NAME2]
    _write(tmp_path / "class" / "ann", _ref())
    (tmp_path / "class" / "ben").mkdir()
    _write(tmp_path / "class", _ref())                                   # a stray notebook at the root
    items, findings = collect([tmp_path / "class"], refs)
    assert sorted((i.learner, i.reference.name, i.path is not None) for i in items) == [
        ("ann", NAME, True), ("ann", NAME2, False), ("ben", NAME, False), ("ben", NAME2, False)]
    assert [f.reason for f in findings if f.path == f"class/{NAME}"][0].startswith("不在学员文件夹里")


def test_collect_reports_every_file(tmp_path):
    refs = [FIXTURE / NAME, FIXTURE / NAME2]
    c = tmp_path / "class"
    _write(c / "mis", _ref(), "1_fixture.ipynb")
    _write(c / "upper", _ref(), "01_FIXTURE.IPYNB")
    _write(c / "topic", _ref(), "fixture_final.ipynb")
    _write(c / "nested" / "unzipped", _ref())
    _write(c / "dup", _ref())
    _write(c / "dup", _ref(), "01_fixture (1).ipynb")
    _write(c / "dup" / ".ipynb_checkpoints", _ref(), "01_fixture-checkpoint.ipynb")
    (c / "dup" / "notes.txt").write_text("hi")
    (c / "link").mkdir()
    (c / "link" / NAME).symlink_to(FIXTURE / NAME)
    _write(c / ".hidden", _ref())
    _write(c / "other", _ref(), "03_unknown.ipynb")
    items, findings = collect([c], refs)
    by = {(i.learner, i.reference.name): i for i in items}
    assert by["mis", NAME].path.name == "1_fixture.ipynb" and "不规范" in by["mis", NAME].notes[0]
    assert by["upper", NAME].path.name == "01_FIXTURE.IPYNB"
    assert by["topic", NAME].path is None  # "fixture" names both references: never guessed
    assert by["nested", NAME].path.parent.name == "unzipped"
    assert by["dup", NAME].path.name == NAME and by["dup", NAME].review
    assert by["link", NAME].path is None and any("符号链接" in n for n in by["link", NAME].notes)
    assert by["other", NAME].path is None and any("03_unknown" in n for n in by["other", NAME].notes)
    assert ".hidden" not in {i.learner for i in items}
    reasons = {f.path: (f.status, f.reason) for f in findings}
    assert reasons["class/link/01_fixture.ipynb"][0] == "refused"
    assert reasons["class/.hidden"][1].startswith("隐藏")
    assert reasons["class/dup/.ipynb_checkpoints"][1].startswith("隐藏")
    assert reasons["class/dup/01_fixture (1).ipynb"][1].startswith("重复")
    assert reasons["class/dup/notes.txt"][1].startswith("不是 notebook")
    assert reasons["class/other/03_unknown.ipynb"][1].startswith("无法对应")


def test_collect_tells_a_lettered_notebook_from_the_one_it_follows(tmp_path):
    """08 and 08b (issue 32's split): a renamed 08b is found by its number with the letter, or by its topic;
    the bare number 8 is 08's, and a name whose number and topic disagree is never guessed."""
    refs = []
    for name in ("08_time_estimate.ipynb", "08b_flops_memory.ipynb"):
        refs.append(_write(tmp_path / "refs", _ref(), name))
    c = tmp_path / "class"
    for learner, name in (("letter", "8b_flops_memory.ipynb"), ("upper", "08B_mine.ipynb"),
                          ("topic", "flops_memory_final.ipynb"), ("bare", "8_mine.ipynb"),
                          ("mixed", "8_flops_memory.ipynb")):
        _write(c / learner, _ref(), name)
    items, _ = collect([c], refs)
    found = {(i.learner, i.reference.name): i.path.name for i in items if i.path is not None}
    assert found == {("letter", "08b_flops_memory.ipynb"): "8b_flops_memory.ipynb",
                     ("upper", "08b_flops_memory.ipynb"): "08B_mine.ipynb",
                     ("topic", "08b_flops_memory.ipynb"): "flops_memory_final.ipynb",
                     ("bare", "08_time_estimate.ipynb"): "8_mine.ipynb"}


def test_collect_keys_learners_by_relative_path(tmp_path):
    refs = [FIXTURE / NAME]
    _write(tmp_path / "sec1" / "alice", _ref())
    _write(tmp_path / "sec2" / "alice", _ref())
    _write(tmp_path / "sec2" / "bob", _ref())
    items, _ = collect([tmp_path / "sec1", tmp_path / "sec2"], refs)
    assert sorted(i.learner for i in items) == ["sec1/alice", "sec2/alice", "sec2/bob"]
    items, _ = collect([tmp_path], refs)                                  # sections inside one root
    assert sorted(i.learner for i in items) == ["sec1/alice", "sec2/alice", "sec2/bob"]
    items, _ = collect([tmp_path / "sec1" / "alice"], refs)               # one learner folder
    assert [i.learner for i in items] == ["alice"]


def test_read_notebook_v3_bom_utf16_and_garbage(tmp_path):
    ref = _ref()
    v3 = tmp_path / "v3.ipynb"
    v3.write_text(nbformat.writes(nbformat.convert(ref, 3), version=3), encoding="utf-8")
    bom = tmp_path / "bom.ipynb"
    bom.write_bytes(codecs.BOM_UTF8 + nbformat.writes(ref).encode())
    u16 = tmp_path / "u16.ipynb"
    u16.write_bytes(nbformat.writes(ref).encode("utf-16"))
    for path in (v3, bom, u16):
        nb = read_notebook(path)
        assert nb.nbformat == 4 and any("return a + b" in c.source for c in nb.cells), path
    bad = tmp_path / "bad.ipynb"
    bad.write_text('{"cells": [ {"cell_type": "code", ', encoding="utf-8")
    with pytest.raises(UnreadableNotebook, match="不是有效的 notebook JSON"):
        read_notebook(bad)


# ---------------------------------------------------------------- tamper scan and literal answers

def test_honest_solutions_scan_clean():
    """No exercise of any notebook (or of the fixtures) is flagged: the scan costs honest learners nothing."""
    sources = [c.source for p in sorted(ROOT.glob("solutions/*.ipynb")) + sorted(FIXTURE.glob("*.ipynb"))
               for c in nbformat.read(p, as_version=4).cells if "exercise" in c.metadata.get("tags", [])]
    assert len(sources) >= 14
    assert {s[:40]: scan(s) for s in sources if scan(s)} == {}


@pytest.mark.parametrize("source, line, reason", [
    ("m = getattr(__import__('s' + 'ys'), 'modules')\nm['course_tools.checks'].expect = print", 1, "__import__"),
    ("import sys as s\ns.modules.clear()", 2, "sys.modules"),
    ("from sys import modules", 1, "sys.modules"),
    ("sys = __import__('sys')\nx = sys.modules", 2, "sys.modules"),
    ("get_ipython().input_transformers_post.append(len)", 1, "IPython"),
    ("%load_ext something", 1, "魔法命令"),
    ("%time import builtins", 1, "builtins"),
    ("import course_tools.checks as c\nc.expect = print", 1, "course_tools"),
    ("import torch\ntorch.allclose = lambda *a, **k: True", 2, "torch.allclose"),
    ("__builtins__['len'] = max", 1, "__builtins__"),
    ("import os\nos.environ['X'] = '1'", 2, "os.environ"),
    # every route to the environment: COURSE_CHECKS=strict keeps a stub a failed check
    ("import os\nvars(os)['environ'].pop('COURSE_CHECKS')", 2, "vars()"),
    ("__import__('os').environ.pop('COURSE_CHECKS')", 1, "environ"),
    ("import posix", 1, "posix"),
    ("import os\nos.environb.clear()", 2, "environb"),
    ("%env COURSE_CHECKS=calm", 1, "魔法命令"),
    ("open('/proc/1/cmdline')", 1, "/proc"),
    ("import signal", 1, "signal"),
    ("import os\nos.kill(1, 9)", 2, "os.kill"),
    ("exec('import sys; sys.modules.clear()')", 1, "sys.modules"),
    ("code = 'x = 1'\neval(code)", 2, "eval"),
    ("g = getattr\ng(x, 'y')", 1, "getattr"),
    ("def f(o, n):\n    return getattr(o, n)", 2, "getattr"),
    ("f.__globals__['expect'] = print", 1, "__globals__"),
    ("import importlib", 1, "importlib"),
])
def test_scan_flags_what_reaches_the_checks_or_the_runtime(source, line, reason):
    flags = scan(source)
    assert [f.line for f in flags][:1] == [line], flags
    assert reason in flags[0].reason and flags[0].code == source.splitlines()[line - 1].strip()


def test_literal_answers_are_read_without_running_anything():
    src = 'def f():\n    """doc"""\n    return {"q1": "B", "q10": 0.999 ** 200, "q11": 30000 / 0.5 / 3600, "x": -1}'
    assert literal_return(src, "f") == {"q1": "B", "q10": 0.999 ** 200, "q11": 30000 / 0.5 / 3600, "x": -1}
    assert literal_return("def f():\n    a = dict(q1='B')\n    return a", "f") == {"q1": "B"}
    for bad in ("def f():\n    return {k: 1 for k in 'ab'}", "def f():\n    return {'q': open('x').read()}",
                "def f():\n    return {'q': 10 ** 100000}", "def f():\n    raise NotImplementedError('hint')"):
        with pytest.raises(LiteralError):
            literal_return(bad, "f")


def test_self_test_is_scored_outside_against_the_key():
    check = outside_check("from course_tools.checks.nb09_self_test import check_self_test_answers\n"
                          "check_self_test_answers(self_test_answers)")
    good = _cell(_ref(NAME2), "ex-answers").source.replace("### BEGIN SOLUTION", "#").replace("### END SOLUTION", "#")
    assert score_outside(check, [good]) == (True, "")
    passed, message = score_outside(check, [good.replace('"q3": "B"', '"q3": "A"')])
    assert not passed and "q3" in message
    computed = "def self_test_answers():\n    from course_tools.checks.nb09_self_test import QUIZ\n" \
               "    return {q.id: q.answer for q in QUIZ.questions}"
    passed, message = score_outside(check, [computed])
    assert not passed and "字面量" in message
    assert outside_check("from course_tools.checks import expect\nexpect(True, 'a', 'b')") is None


# ---------------------------------------------------------------- reports

def test_csv_fields_are_neutralised_and_clean():
    assert safe_field('=HYPERLINK("http://x")') == "'=HYPERLINK(\"http://x\")"
    assert [safe_field(s)[:2] for s in ("+1", "-1", "@A", "\tx")] == ["'+", "'-", "'@", "x"]
    assert safe_field("a\x1b[31mred\x07\nnext\u202e") == "ared next"


def _grades():
    return [Grade("=ann", NAME, 1, 2, ["check-square: 期望 x"], [], [CheckOutcome("check-add", True),
                                                                    CheckOutcome("check-square", False, "期望 x")]),
            Grade("ben", NAME, 2, 2, [], [], [CheckOutcome("check-add", True), CheckOutcome("check-square", True)])]


def test_report_rows_resume_pass_rate_and_feedback(tmp_path):
    path = tmp_path / "grades.csv"
    report = Report(path)
    for g in _grades():
        report.add(g)
    with open(path, "a", encoding="utf-8") as f:
        f.write("torn,01_fix")                                         # a run killed mid-write
    resumed = Report(path, resume=True)
    assert resumed.done == {("'=ann", NAME), ("ben", NAME)}
    resumed.finish(resumed.grades)
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["learner"] for r in rows] == ["'=ann", "ben"] and tuple(rows[0]) == grade_report.row_columns()
    rates = list(csv.reader(open(tmp_path / "grades.pass_rate.csv", encoding="utf-8")))
    assert rates[1:] == [[NAME, "check-add", "2", "2", "1.000"], [NAME, "check-square", "1", "2", "0.500"]]
    feedback = (tmp_path / "grades_feedback" / "ann.md").read_text(encoding="utf-8")
    assert "总分: 1/2" in feedback and "❌ check-square: 期望 x" in feedback


def test_merge_shards_and_refuse_overlap(tmp_path):
    a, b = _grades()
    for name, grades in (("s1.csv", [a]), ("s2.csv", [b])):
        r = Report(tmp_path / name)
        for g in grades:
            r.add(g)
        r.finish(grades)
    merged = merge_reports([tmp_path / "s1.csv", tmp_path / "s2.csv"], tmp_path / "all.csv")
    assert [g.key for g in merged] == [("'=ann", NAME), ("ben", NAME)]
    assert [len(g.checks) for g in load_report(tmp_path / "all.csv")] == [2, 2]
    with pytest.raises(ValueError, match="分片不应重叠"):
        merge_reports([tmp_path / "s1.csv", tmp_path / "all.csv"], tmp_path / "again.csv")
    assert grade.main(["merge", str(tmp_path / "s1.csv"), str(tmp_path / "s2.csv"), "--report",
                       str(tmp_path / "cli.csv")]) == 0


def test_shards_partition_the_learners(tmp_path):
    for name in ("a", "b", "c", "d", "e"):
        _write(tmp_path / "class" / name, _ref())
    items, findings = collect([tmp_path / "class"], [FIXTURE / NAME])
    parts = [pipeline_shard(items, findings, (k, 3))[0] for k in (1, 2, 3)]
    learners = [{i.learner for i in p} for p in parts]
    assert set().union(*learners) == {"a", "b", "c", "d", "e"} and sum(map(len, learners)) == 5
    assert learners == [{i.learner for i in pipeline_shard(items, findings, (k, 3))[0]} for k in (1, 2, 3)]


# ---------------------------------------------------------------- the sandbox

def test_missing_bubblewrap_stops_the_grader_with_a_chinese_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    monkeypatch.setattr(sandbox, "_AVAILABLE", {})
    _write(tmp_path / "class" / "ann", _ref())
    assert grade.main([str(tmp_path / "class"), "--solutions", str(FIXTURE)]) == 2
    err = capsys.readouterr().err
    assert "bubblewrap" in err and "apt-get install bubblewrap" in err and "--no-sandbox" in err


def test_bubblewrap_without_namespaces_gives_the_reason(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{sandbox.os.environ['PATH']}")
    monkeypatch.setattr(sandbox, "_AVAILABLE", {})
    with pytest.raises(sandbox.SandboxUnavailable) as info:
        sandbox.check_available()
    assert "无法创建沙箱" in str(info.value) and "No permissions" in str(info.value) and "--no-sandbox" in str(info.value)


def test_tmpfs_mounts_come_before_the_read_only_binds(tmp_path):
    """A virtual environment under /tmp (CI creates one with mktemp) must not be hidden by the sandbox's /tmp."""
    args = sandbox._bwrap_args(sandbox.Limits(), {}, [tmp_path])
    binds = [i for i, a in enumerate(args) if a == "--ro-bind"]
    assert binds and max(i for i, a in enumerate(args) if a == "--tmpfs") < min(binds)
    assert args[-4:] == ["--remount-ro", "/dev", "--remount-ro", "/"]


def _box_runs(runs, folders, cell_timeout=30.0, grace=2.0, use_sandbox=True):
    """Each list of cell sources in a kernel box of its own (in its folder), side by side as the grader runs its
    kernels: [(result, seconds of that run)]."""
    boxes = [sandbox.KernelBox(folder, sandbox.Limits(), 1, use_sandbox) for folder in folders]

    async def timed(sources, box):
        start = time.monotonic()
        result = await run_cells(list(enumerate(sources)), box, cell_timeout=cell_timeout, budget=Budget(120),
                                 grace=grace)
        return result, time.monotonic() - start
    try:
        async def all_runs():
            return await asyncio.gather(*(timed(sources, box) for sources, box in zip(runs, boxes)))
        return asyncio.run(all_runs())
    finally:
        for box in boxes:
            box.close()


def _box_run(sources, tmp_path, **options):
    return _box_runs([sources], [tmp_path], **options)[0]


def test_sandboxed_kernel_sees_nothing_of_the_host(sandbox_ok, tmp_path, monkeypatch):
    """Of the repository, the kernel sees the two packages and (README layout: ``.venv`` in the root) the
    environment, read-only at its real path; nothing else (no solutions/, .git, tests/)."""
    monkeypatch.setenv("GRADE_SECRET", "instructor-token")
    prefix = Path(sys.prefix).resolve()
    expected = sorted(["course_tools", "course_utils"] + ([prefix.relative_to(ROOT).parts[0]]
                                                         if ROOT in prefix.parents else []))
    probe = (
        "import os, pathlib, socket, course_utils\n"
        "assert os.getpid() < 10, os.getpid()\n"                              # own PID namespace
        "assert os.getenv('GRADE_SECRET') is None and os.getenv('HOME') == '/home/learner', 'env'\n"
        "assert os.listdir('/home/learner') == [] and os.getcwd() == '/scratch', os.listdir('/home/learner')\n"
        "root = pathlib.Path(course_utils.__file__).resolve().parents[1]\n"
        f"assert sorted(os.listdir(root)) == {expected!r}, os.listdir(root)\n"
        f"assert sorted(os.listdir({sys.prefix!r})) == {sorted(os.listdir(sys.prefix))!r}, 'environment'\n"
        f"assert not pathlib.Path({str(FIXTURE)!r}).exists(), 'reference visible'\n"
        f"assert not pathlib.Path({str(tmp_path / 'secret.txt')!r}).exists(), 'grader file visible'\n"
        "import sys\n"
        "for target in (course_utils.__file__, sys.prefix + '/pyvenv.cfg'):\n"
        "    try:\n        open(target, 'a')\n    except OSError as e:\n        assert e.errno == 30, e\n"
        "    else:\n        raise AssertionError(target + ' is writable')\n"
        "try:\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\nexcept OSError:\n    pass\n"
        "else:\n    raise AssertionError('network reachable')\n")
    (tmp_path / "secret.txt").write_text("grader's own file")   # beside the kernel's connection folder
    result, _ = _box_run([probe], tmp_path)
    assert result.stop is None and result.cells[0].status == "ok", result.cells[0]


@pytest.mark.slow
def test_sandbox_limits_dead_kernels_and_ignored_interrupts(sandbox_ok, tmp_path, monkeypatch):
    hog, _ = _box_run(["import mmap\nmmap.mmap(-1, 8 << 30)"], tmp_path)          # RLIMIT_AS: no 8 GiB map
    assert hog.cells[0].status == "error" and "OSError" in hog.cells[0].ename
    dead, seconds = _box_run(["import os\nos._exit(3)", "x = 1"], tmp_path, cell_timeout=60)
    assert dead.stop.status == "dead" and dead.stop.index == 0 and seconds < 20      # noticed at once
    with monkeypatch.context() as wide:   # loaded 5-7 deep, 2 CPU-s can outlast 5x2 s of wall time: stop "wall"
        wide.setattr(grade_kernel, "WALL_FACTOR", 20)   # 40 s: room for the CPU limit to stop it first
        loop, _ = _box_run(["while True:\n    pass", "x = 1"], tmp_path, cell_timeout=2)
    assert loop.stop.status == "timeout" and loop.stop.ename == "KeyboardInterrupt" and 1 not in loop.cells
    swallow = "import time\nwhile True:\n    try:\n        time.sleep(0.01)\n    except KeyboardInterrupt:\n        pass"
    stuck, seconds = _box_run([swallow], tmp_path, cell_timeout=2, grace=2)   # it sleeps: the wall backstop, 5 x 2 s
    assert stuck.stop.status == "unresponsive" and 12 <= seconds < 30


@pytest.fixture
def cpu_hogs():
    """Two busy Python loops per core beside the test, each in a session of its own (``cputime.cpu_hogs``)."""
    with cputime.cpu_hogs(2 * (os.cpu_count() or 1)) as hogs:
        yield hogs


@pytest.mark.slow
def test_cell_limits_count_cpu_seconds_not_load(sandbox_ok, tmp_path, cpu_hogs, monkeypatch):
    """Beside the hogs, 1.5 CPU-s of honest work passes a 3 CPU-s cell limit though it takes longer than 3 s of
    wall time (the hogs leave it under half a core); a busy loop under the same limit still stops at it.

    The wall backstop is widened (20x: 60 s) for this test only: its cells use half their CPU limit, so beside
    more load than its own hogs (bench/under_load.py adds 4) a 5x backstop can come first, which changes the
    reason shown, not the outcome."""
    monkeypatch.setattr(grade_kernel, "WALL_FACTOR", 20)
    work = "import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end:\n    pass"
    folders = [tmp_path / "honest", tmp_path / "loop"]
    for folder in folders:
        folder.mkdir()
    (honest, _), (loop, _) = _box_runs([[work, "x = 1"], ["while True:\n    pass"]], folders, cell_timeout=3)
    assert honest.stop is None and [c.status for c in honest.cells.values()] == ["ok", "ok"], honest.cells
    assert honest.cells[0].seconds > 3, honest.cells[0]     # a 3 s wall-clock limit would have failed it
    assert loop.stop.status == "timeout" and loop.stop.ename == "KeyboardInterrupt", loop.stop   # CPU, not the backstop


def test_a_grader_bug_fails_its_own_row_only_with_the_total_kept(tmp_path, monkeypatch):
    """An exception while grading one row (a notebook, a homework) is that row: every check failed with "评分出错",
    the reason after its other notes (the collector's, --no-sandbox's) and its review flags, its total kept; the
    learner's other rows and the other learners' are graded."""
    from types import SimpleNamespace

    from course_grader import pipeline
    from course_grader.upgrades import UPGRADE_LABELS

    solutions = tmp_path / "solutions"
    shutil.copytree(FIXTURE, solutions)
    (solutions / "homework").mkdir()
    for learner in ("ann", "ben"):
        _write(tmp_path / "class" / learner, _ref(), NAME if learner == "ben" else NAME.upper())   # ann's misnamed
        (tmp_path / "class" / learner / "homework").mkdir()
    (tmp_path / "class" / "ben" / "hw.bundle").write_bytes(b"")   # a second hand-in: flagged for review

    async def notebook(item, released, options, private):
        if (item.learner, item.reference.name) == ("ann", NAME):
            raise RuntimeError("boom in a step")
        return grade_report.Grade(item.learner, item.reference.name, 2, 2)

    def homework(item, setup, **kw):
        if item.learner == "ben":
            raise KeyError("no such upgrade")
        return SimpleNamespace(grade=grade_report.Grade(item.learner, "10_homework.ipynb", 5, 5), scripts={})
    monkeypatch.setattr(pipeline, "grade_item", notebook)
    monkeypatch.setattr(pipeline, "grade_homework", homework)
    report = tmp_path / "out" / "grades.csv"
    grades = grade.grade_all([tmp_path / "class"], solutions, grade.Options(sandbox=False), report, verbose=False)
    rows = {(g.learner, g.notebook): g for g in grade_report.load_report(report)}
    assert {k: (g.passed, g.total) for k, g in rows.items()} == {
        ("ann", NAME): (0, 2), ("ann", NAME2): (2, 2), ("ann", "10_homework.ipynb"): (5, 5),
        ("ben", NAME): (2, 2), ("ben", NAME2): (2, 2), ("ben", "10_homework.ipynb"): (0, 5)}
    assert len(grades) == 6
    for key, labels, reason in ((("ann", NAME), ["check-add", "check-square"], "评分出错: RuntimeError: boom in a step"),
                                (("ben", "10_homework.ipynb"), list(UPGRADE_LABELS), "评分出错: KeyError: 'no such upgrade'")):
        assert rows[key].notes[0] == "未沙箱运行(--no-sandbox)" and rows[key].notes[-1] == reason
        assert [(c.check, c.passed, c.message) for c in rows[key].checks] == [(c, False, "评分出错") for c in labels]
    assert "不规范" in " ".join(rows["ann", NAME].notes) and "不止一份" in " ".join(rows["ben", "10_homework.ipynb"].review)


def test_no_sandbox_rows_say_so_and_resume_keeps_finished_rows(tmp_path):
    """Benign code only: without the sandbox the learner's code runs as the instructor."""
    _write(tmp_path / "class" / "ann", _ref())
    report = tmp_path / "out" / "grades.csv"
    options = grade.Options(cell_timeout=60, timeout=120, sandbox=False)
    first = grade.grade_all([tmp_path / "class"], FIXTURE, options, report, verbose=False)
    assert [(g.learner, g.notebook, g.passed, g.total) for g in first] == [("ann", NAME, 2, 2), ("ann", NAME2, 0, 2)]
    assert all("未沙箱" in g.notes[0] for g in first)
    rows = report.read_text(encoding="utf-8").replace("未沙箱运行(--no-sandbox)", "kept-from-first-run")
    report.write_text(rows, encoding="utf-8")
    _write(tmp_path / "class" / "ben", _solved_add_only())
    second = grade.grade_all([tmp_path / "class"], FIXTURE, options, report, resume=True, verbose=False)
    by = {(g.learner, g.notebook): g for g in second}
    assert by["ann", NAME].notes[0] == "kept-from-first-run"                  # not graded again
    assert (by["ben", NAME].passed, by["ben", NAME].total) == (1, 2)
    assert len(list(csv.DictReader(open(report, encoding="utf-8")))) == 4
    shutil.rmtree(tmp_path / "out")


@pytest.mark.slow
def test_bench_grading_runs_both_arms(sandbox_ok, tmp_path):
    """bench/grading.py on the fixtures: both arms grade the same notebooks, every check passes in both."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("bench_grading", ROOT / "bench" / "grading.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "grading.json"
    code = bench.main(["--solutions", str(FIXTURE), "--learners", "2", "--notebooks", "01", "--no-workbook",
                       "--json", str(out)])
    result = json.loads(out.read_text())
    assert code == (0 if result["passed"] else 1) and result["all_checks_passed"]
    assert len(result["rounds"]) == 1 and result["sandbox_s"] > 0 and result["plain_s"] > 0


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(f"{pid}: {args[:160]}")
    return found


@pytest.mark.slow
def test_a_killed_grader_takes_its_kernels_along(sandbox_ok, tmp_path):
    """SIGKILL the grader mid-cell: its sandboxes die with it (PR_SET_PDEATHSIG); the next run sweeps its folder."""
    loop = learner_notebook(_ref())
    _cell(loop, "ex-add").source = "def add(a, b):\n    while True:\n        pass"
    _write(tmp_path / "class" / "ann", loop)
    proc = subprocess.Popen([sys.executable, "-m", "course_grader", str(tmp_path / "class"), "--solutions",
                             str(FIXTURE), "--cell-timeout", "120"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = "/" + sandbox.private_prefix(proc.pid)
    try:
        deadline = time.monotonic() + 90
        while not any("bwrap" in p for p in _processes_mentioning(marker)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_mentioning(marker), "the grader never started a sandbox"
        time.sleep(1)
    finally:
        proc.kill()
        proc.wait()
    for _ in range(50):
        if not _processes_mentioning(marker):
            break
        time.sleep(0.1)
    assert _processes_mentioning(marker) == []
    left = list(Path(sandbox.tempfile.gettempdir()).glob(sandbox.private_prefix(proc.pid) + "*"))
    assert left                                   # SIGKILL left the grader no time to clean up
    sandbox.private_dir().rmdir()
    assert not any(p.exists() for p in left)


_OTHER_CHECKOUT = """
import os, sys
import course_tools, course_utils
from course_grader import sandbox
assert course_utils.__file__.startswith(sys.argv[1]), course_utils.__file__
if sys.argv[2] == "no-pythonpath":   # the grader as it was: the sandbox left to the environment's editable install
    plain = sandbox.kernel_env
    sandbox.kernel_env = lambda *a, **k: {k_: v for k_, v in plain(*a, **k).items() if k_ != "PYTHONPATH"}
try:
    sandbox.check_available()
except sandbox.SandboxUnavailable as exc:
    print("UNAVAILABLE", exc)
    sys.exit(0)
out = sandbox._probe(sandbox.Limits(), [sys.executable, "-c", "import course_utils; print('AT', course_utils.__file__)"])
print(out.stdout, out.stderr)
"""


@pytest.mark.parametrize("variant", ["pythonpath", "no-pythonpath"])
def test_grader_in_another_checkout_imports_its_own_packages(sandbox_ok, tmp_path, variant):
    """The environment's editable install points at this checkout; a grader run from another checkout
    (its packages first on sys.path) mounts its own packages, and the sandbox must import exactly those.
    Without PYTHONPATH inside, Python fails in the sandbox, and the probe must say that, not blame namespaces."""
    other = tmp_path / "other-checkout"
    for name in ("course_utils", "course_tools", "course_grader"):
        shutil.copytree(ROOT / name, other / name, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(other)}
    out = subprocess.run([sys.executable, "-c", _OTHER_CHECKOUT, str(other), variant], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if variant == "pythonpath":
        assert f"AT {other}/course_utils/__init__.py" in out.stdout, out.stdout
    else:
        assert "UNAVAILABLE" in out.stdout and "沙箱里的 Python 启动失败" in out.stdout, out.stdout
        assert "ModuleNotFoundError" in out.stdout and "命名空间" not in out.stdout, out.stdout
