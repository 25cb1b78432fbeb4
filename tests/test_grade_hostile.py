"""A hostile class, graded in ONE grader call, as an instructor would: nothing a learner writes changes
anyone's grade, reaches the reference, survives the run or stops the grader.

Each hostile learner attacks through exercise 1 of 01_fixture (``add``) and solves exercise 2
(``square``) honestly, so the score its honest exercise deserves is 1/2; 02_fixture's hostile
learners attack the self-test answers and solve ``cube``. Attacks that could hurt the machine
outside a sandbox only fire when the kernel is PID < 50 (inside bubblewrap's PID namespace); the
test skips (naming the package) only where bubblewrap is not installed.
"""
from __future__ import annotations

import codecs
import csv
import hashlib
import os
import shutil
import socket
import time
from pathlib import Path

import nbformat
import pytest

import course_grader as grade
from course_grader import sandbox
from course_grader.report import FILE_COLUMNS, row_columns
from course_tools.release import learner_notebook

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "grading" / "solutions"
NAME, NAME2 = "01_fixture.ipynb", "02_fixture.ipynb"
MARKER = "PWNED-BY-A-LEARNER"
FORMULAS = ['=HYPERLINK("evil.example")', "+SUM(1)", "-2+3", "@cmd"]
CONTROL = "ctl\x1b[31mred\x07"
SQUARE = "def square(x):\n    return x * x"
CUBE = "def cube(x):\n    return x ** 3"
IN_SANDBOX = "import os\nIN_SANDBOX = os.getpid() < 50\n"


def _ref(name=NAME):
    return nbformat.read(FIXTURE / name, as_version=4)


def _with(add: str, square: str = SQUARE):
    nb = learner_notebook(_ref())
    for cell in nb.cells:
        if cell.get("id") == "ex-add":
            cell.source = add
        elif cell.get("id") == "ex-square":
            cell.source = square
    return nb


def _with2(answers: str, cube: str = CUBE):
    nb = learner_notebook(_ref(NAME2))
    for cell in nb.cells:
        if cell.get("id") == "ex-answers":
            cell.source = answers
        elif cell.get("id") == "ex-cube":
            cell.source = cube
    return nb


def _write(path: Path, nb) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink()
            else ("link:" + os.readlink(p) if p.is_symlink() else "dir") for p in sorted(folder.rglob("*"))}


def _answers(ref_source: str) -> str:
    return ref_source.replace("### BEGIN SOLUTION", "#").replace("### END SOLUTION", "#")


def _hostile(root: Path, report: Path, victim: Path, port: int) -> dict[str, tuple[str, str]]:
    """Write the class; returns {learner: (what it tries, expected passed/total per notebook)}."""
    c = root / "class"
    ref, ref2 = _ref(), _ref(NAME2)
    repo_targets = [ROOT / "course_tools" / "checks" / "__init__.py", ROOT / "README.md", ROOT / "solutions" / "01_amp.ipynb",
                    FIXTURE / NAME]
    honest = "def add(a, b):\n    return a + b"
    sources = {
        # forging: the old results file, the report, a printed success line; add itself is wrong
        "forge_results": (
            "import json\n"
            "record = json.dumps({'index': 3, 'id': 'check-add', 'tags': ['check'], 'outcome': 'passed'})\n"
            f"for target in ['_grade_results.jsonl', '../_grade_results.jsonl', {str(report)!r}, "
            f"{str(report.with_name('grades.checks.csv'))!r}]:\n"
            "    try:\n"
            f"        open(target, 'a').write(record + '\\n{MARKER}\\n')\n"
            "    except OSError:\n"
            "        pass\n"
            "print('✅ add 正确')\n"
            "def add(a, b):\n    return 0"),
        # reading the answers: through course_utils.__file__, the reference path, other processes' command lines
        "read_answers": (
            "import os, pathlib, course_utils\n"
            "FOUND = False\n"
            "places = [pathlib.Path(course_utils.__file__).resolve().parents[1] / 'solutions', "
            f"pathlib.Path({str(FIXTURE)!r}), pathlib.Path('..'), pathlib.Path('/tmp')]\n"
            "proc = '/pr' + 'oc'\n"
            "for pid in os.listdir(proc):\n"
            "    try:\n"
            "        args = open(f'{proc}/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
            "    except OSError:\n"
            "        continue\n"
            "    places += [pathlib.Path(a.decode(errors='ignore')).parent for a in args if b'/' in a]\n"
            "for place in places:\n"
            "    try:\n"
            "        files = list(place.glob('*.ipynb')) + list(place.glob('*/*.ipynb'))\n"
            "    except OSError:\n"
            "        continue\n"
            "    for nb in files:\n"
            "        try:\n"
            "            FOUND = FOUND or ('BEGIN ' + 'SOLUTION') in nb.read_text()\n"
            "        except OSError:\n"
            "            pass\n"
            "def add(a, b):\n    return a + b if FOUND else None"),
        # writing outside: another learner's submission, the reference, the checks, the report, the repository
        "write_outside": (
            IN_SANDBOX +
            f"for target in {[str(victim), str(report)] + [str(t) for t in repo_targets]!r}:\n"
            "    if IN_SANDBOX:\n"
            "        try:\n"
            f"            open(target, 'a').write('\\n# {MARKER}\\n')\n"
            "        except OSError:\n"
            "            pass\n"
            f"{honest}"),
        # planting: conftest.py for a later run, and a detached process that rewrites the report later
        "plant": (
            "import subprocess, sys\n"
            "for target in ['conftest.py', '../conftest.py', '/tmp/conftest.py']:\n"
            "    try:\n"
            f"        open(target, 'w').write('# {MARKER}\\n')\n"
            "    except OSError:\n"
            "        pass\n"
            f"code = {f'import time; time.sleep(3); open({str(report)!r}, {chr(34)}w{chr(34)}).write({MARKER!r})'!r}\n"
            "subprocess.Popen([sys.executable, '-c', code], start_new_session=True)\n"
            f"{honest}"),
        # killing the grader: every process the kernel can signal
        "kill_grader": (
            IN_SANDBOX + "import subprocess, sys\n"
            "if IN_SANDBOX:\n"
            "    subprocess.run([sys.executable, '-c', 'import os; os.kill(-1, 9)'])\n"
            f"{honest}"),
        # surviving children: a new session and a double fork
        "children": (
            "import os, subprocess, time\n"
            "subprocess.Popen(['sleep', '987654'], start_new_session=True)\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        time.sleep(987653)\n"
            "    os._exit(0)\n"
            f"{honest}"),
        # memory: 8 GiB of address space (lazily mapped, so harmless even without a limit)
        "memhog": "import mmap\ndef add(a, b):\n    block = mmap.mmap(-1, 8 << 30)\n    return a + b",
        "loop_early": "def add(a, b):\n    while True:\n        pass",
        # no CPU used at all: only the wall-clock backstop (5 x the cell's CPU limit) stops it
        "sleeper": "import time\ndef add(a, b):\n    time.sleep(10**6)\n    return a + b",
        "loop_swallow": ("import time\ndef add(a, b):\n    while True:\n        try:\n            time.sleep(0.01)\n"
                         "        except KeyboardInterrupt:\n            pass"),
        "dies": "import os\ndef add(a, b):\n    os._exit(3)",
        # in-kernel tampering, obfuscated: would make check-add pass if it ran
        "tamper": ("getattr(__import__('s' + 'ys'), 'modules')['course_tools.checks'].expect = lambda *a, **k: None\n"
                   "def add(a, b):\n    return 0"),
        # the calm "还没做" note of a learner's own Jupyter, switched on: a stub still earns nothing
        "calm_switch": "import os\nos.environ.pop('COURSE_CHECKS', None)\ndef add(a, b):\n    raise NotImplementedError",
        # the sandbox itself, seen from inside: PID 2-ish, no secret, empty home, no network, no host files
        "probe": (
            "import os, socket\n"
            "def isolated():\n"
            "    try:\n"
            f"        socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
            "        return False\n"
            "    except OSError:\n"
            "        pass\n"
            f"    return (os.getpid() < 50 and os.getenv('GRADE_SECRET') is None and not os.path.exists({str(ROOT / '.git')!r})"
            f" and not os.path.exists({str(ROOT / 'tests')!r}) and not os.path.exists({str(c)!r}))\n"
            "OK = isolated()\n"
            "def add(a, b):\n    return a + b if OK else None"),
    }
    expect: dict[str, tuple[str, str]] = {}
    for learner, source in sources.items():
        compile(source, learner, "exec")                               # an attack that does not parse proves nothing
        _write(c / learner / NAME, _with(source))
        expect[learner] = ("1/2" if learner not in ("write_outside", "plant", "children", "probe") else "2/2", "0/2")
    # the self-test: answers computed from the key inside the kernel (flagged or not) are worth nothing
    good_answers = _answers(next(x.source for x in ref2.cells if x.get("id") == "ex-answers"))
    _write(c / "keyreader" / NAME2, _with2(
        "def self_test_answers():\n    import re, course_utils, pathlib\n"
        "    key = pathlib.Path(course_utils.__file__).resolve().parents[1] / 'course_tools/checks/nb09_self_test.py'\n"
        "    return dict(re.findall(r'Question\\(\"(q\\d+)\".*?answer=\"(\\w+)\"', key.read_text(), re.S))"))
    _write(c / "computed" / NAME2, _with2(
        "def self_test_answers():\n    from course_tools.checks.nb09_self_test import QUIZ\n"
        "    return {q.id: q.answer for q in QUIZ.questions}"))
    _write(c / "wrong_answer" / NAME2, _with2(good_answers.replace('"q3": "B"', '"q3": "A"')))
    _write(c / "arithmetic" / NAME2, _with2(good_answers.replace("0.82", "0.999 ** 200").replace("16.7", "30000 / 0.5 / 3600")))
    for learner in ("keyreader", "computed", "wrong_answer", "arithmetic"):
        expect[learner] = ("0/2", "2/2" if learner == "arithmetic" else "1/2")
    # good answers, two ways, next to all of the above
    _write(c / "good" / NAME, ref)
    _write(c / "good" / NAME2, ref2)
    _write(c / "good" / ".ipynb_checkpoints" / "01_fixture-checkpoint.ipynb", ref)
    (c / "good" / "notes.txt").write_text("my notes")
    _write(c / "good2" / NAME, _with("def add(a, b):\n    return sum((a, b))", "def square(x):\n    return x ** 2"))
    expect["good"], expect["good2"] = ("2/2", "2/2"), ("2/2", "0/2")
    _write(c / "unstarted" / NAME, learner_notebook(ref))              # the released stubs, untouched
    _write(c / "unstarted" / NAME2, learner_notebook(ref2))
    expect["unstarted"] = ("0/2", "0/2")
    # collection: misnamed, wrong case, nested, duplicate, symlink, v3, BOM, hidden, stray, broken, empty
    _write(c / "misnamed" / "1_fixture.ipynb", ref)
    _write(c / "upper" / "01_FIXTURE.IPYNB", ref)
    _write(c / "nested" / "unzipped" / NAME, ref)
    _write(c / "dup" / NAME, ref)
    _write(c / "dup" / "01_fixture (1).ipynb", learner_notebook(ref))
    (c / "symlink").mkdir()
    (c / "symlink" / NAME).symlink_to(FIXTURE / NAME)
    (c / "v3").mkdir()
    (c / "v3" / NAME).write_text(nbformat.writes(nbformat.convert(ref, 3), version=3), encoding="utf-8")
    (c / "bom").mkdir()
    (c / "bom" / NAME).write_bytes(codecs.BOM_UTF8 + nbformat.writes(ref).encode())
    _write(c / ".sneaky" / NAME, ref)
    _write(c / NAME, ref)                                              # a stray notebook at the top
    (c / "broken").mkdir()
    (c / "broken" / NAME).write_text('{"cells": [{"cell_type": "code", "metadata": [], "id": ["x"], "source": 5}], '
                                     '"metadata": {}, "nbformat": 4, "nbformat_minor": 5}', encoding="utf-8")
    (c / "corrupt").mkdir()
    (c / "corrupt" / NAME).write_text('{"cells": [', encoding="utf-8")
    (c / "empty").mkdir()
    for learner in ("misnamed", "upper", "nested", "dup", "v3", "bom"):
        expect[learner] = ("2/2", "0/2")
    for learner in ("symlink", "broken", "corrupt", "empty"):
        expect[learner] = ("0/2", "0/2")
    expected = {f"class/{k}": v for k, v in expect.items()}
    # a second root with a learner of the same name, and learner folders given as roots of their own
    # (their key is their name alone, so a name like =HYPERLINK(...) reaches the CSV's first column)
    _write(root / "sec2" / "good" / NAME, ref)
    expected["sec2/good"] = ("2/2", "0/2")
    for learner in FORMULAS + [CONTROL]:
        _write(root / "named" / learner / NAME, ref)
        expected[learner] = ("2/2", "0/2")
    return expected


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap (Debian package 'bubblewrap', command bwrap)")
    sandbox.check_available()   # installed but failing: an error, never a skip
    root = tmp_path_factory.mktemp("hostile")
    report = root / "report" / "grades.csv"
    report.parent.mkdir()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    expected = _hostile(root, report, root / "class" / "good" / NAME, listener.getsockname()[1])
    before = {name: _snapshot(root / name) for name in ("class", "sec2", "named")} | {"fixture": _snapshot(FIXTURE.parent)}
    os.environ["GRADE_SECRET"] = "instructor-token"
    options = grade.Options(cell_timeout=6, timeout=90, grace=2, jobs=3)
    try:
        start = time.monotonic()
        roots = [root / "class", root / "sec2"] + [root / "named" / name for name in FORMULAS + [CONTROL]]
        grades = grade.grade_all(roots, FIXTURE, options, report, verbose=False)
        seconds = time.monotonic() - start
    finally:
        del os.environ["GRADE_SECRET"]
        listener.close()
    processes = _leftovers()
    after = {name: _snapshot(root / name) for name in ("class", "sec2", "named")} | {"fixture": _snapshot(FIXTURE.parent)}
    return {"grades": {(g.learner, g.notebook): g for g in grades}, "expected": expected, "report": report,
            "before": before, "after": after, "processes": processes, "seconds": seconds, "root": root}


def _leftovers() -> list[str]:
    """Command lines of processes this run could have left: the sleepers, kernels, sandboxes.

    Kernels and sandboxes are this grader's when their folder has this process's
    ``sandbox.private_prefix`` (``grade_all`` runs here): under xdist another worker may be grading at the same moment,
    and its live kernels are not this run's leftovers.
    """
    mine = "/" + sandbox.private_prefix(os.getpid())
    found = []
    for pid in os.listdir("/proc"):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "98765" in args or (("ipykernel_launcher" in args or "bwrap" in args) and mine in args):
            found.append(f"{pid}: {args[:200]}")
    return found


def _score(g) -> str:
    return f"{g.passed}/{g.total}"


def test_every_learner_gets_the_score_its_honest_exercises_deserve(graded):
    g = graded["grades"]
    got = {learner: (_score(g[learner, NAME]), _score(g[learner, NAME2])) for learner in graded["expected"]}
    assert got == graded["expected"]
    assert {learner for learner, _ in g} == set(graded["expected"])   # no learner missing, none invented


def test_hostile_rows_say_what_happened(graded):
    g = graded["grades"]
    notes = {k[0]: " | ".join(v.notes) for k, v in g.items() if k[1] == NAME}
    # Stopped by its 6 CPU seconds; beside heavy load (5-7 deep on 2 cores, 3 kernels) the 30 s wall backstop can
    # come first. Either way the rerun treats the exercise as unfinished. The CPU limit itself is held by
    # test_grade.py's busy loop (its backstop widened) and test_cell_limits_count_cpu_seconds_not_load.
    stopped = ("超过单格时限 6 s(CPU 时间),已中断", "墙钟时间超过 30 s(单格 CPU 时限 6 s 的 5 倍,在 sleep 或等待?),已中断")
    assert any(f"{s};重新运行,练习 1(ex-add) 按未完成处理" in notes["class/loop_early"] for s in stopped)
    assert "墙钟时间超过 30 s" in notes["class/sleeper"] and "重新运行,练习 1(ex-add) 按未完成处理" in notes["class/sleeper"]
    assert "仍不响应中断" in notes["class/loop_swallow"] and "按崩溃处理" in notes["class/loop_swallow"]
    assert "内核在运行 check-add 时退出" in notes["class/dies"] and "超过单格时限" not in notes["class/dies"]
    assert "内核在运行" in notes["class/kill_grader"]
    assert "MemoryError" in notes["class/memhog"] or "OSError" in notes["class/memhog"]
    tamper = g["class/tamper", NAME]
    assert tamper.review and "第 1 行" in tamper.review[0] and "__import__" in tamper.review[0]
    assert "需人工检查" in notes["class/tamper"]
    calm = g["class/calm_switch", NAME]
    assert calm.review and "os.environ" in calm.review[0]
    assert [c.passed for c in calm.checks if c.check == "check-add"] == [False]
    assert not any(g[k].review for k in g if k[0] not in ("class/tamper", "class/dup", "class/computed",
                                                          "class/calm_switch"))
    assert "字面量" in " ".join(g["class/keyreader", NAME2].notes) and g["class/computed", NAME2].review
    assert "q3" in " ".join(g["class/wrong_answer", NAME2].notes)
    assert "不规范" in notes["class/misnamed"] and "不规范" in notes["class/upper"] and "不规范" in notes["class/nested"]
    assert g["class/dup", NAME].review and "符号链接" in notes["class/symlink"]
    assert "无法读取" in notes["class/corrupt"] and "未提交" in notes["class/empty"]
    assert all(g[k].total == 2 for k in g)                              # nothing exempts itself


def _files(top: Path) -> list[Path]:
    """Every file below ``top``; folders that vanish during the walk (other workers' scratch) are skipped."""
    return [Path(folder, name) for folder, _, names in os.walk(top) for name in names]


def test_nothing_outside_the_scratch_folder_changed(graded):
    assert graded["after"] == graded["before"]                          # submissions, sections, references
    time.sleep(4)                                                       # the planted rewriter would fire now
    hits, files = [], [*_files(ROOT), *_files(graded["report"].parent), *Path("/tmp").glob("*conftest*")]
    assert Path(__file__) in files                                      # the walk does reach the repository
    for path in files:
        try:
            if path.is_file() and not path.is_symlink() and path.stat().st_size < 5_000_000:
                if MARKER.encode() in path.read_bytes() and path.resolve() != Path(__file__).resolve():
                    hits.append(str(path))
        except FileNotFoundError:   # another xdist worker's file, gone since the walk: not the learner's
            pass
    assert hits == []
    assert not list(graded["root"].rglob("conftest.py")) and not list(graded["root"].rglob("_grade_results.jsonl"))


def test_no_process_outlives_the_run(graded):
    assert graded["processes"] == []
    assert _leftovers() == []
    box = sandbox.private_dir()      # the kernels' folders really carry the prefix _leftovers() looks for
    box.rmdir()
    assert box.name.startswith(sandbox.private_prefix(os.getpid()))


def test_csv_parses_with_a_row_per_learner_per_notebook(graded):
    report = graded["report"]
    with open(report, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == row_columns()
    learners = {r["learner"] for r in rows}
    assert len(rows) == 2 * len(learners) == 2 * len(graded["expected"])
    assert {(r["learner"], r["notebook"]) for r in rows} == {(l, n) for l in learners for n in (NAME, NAME2)}
    for r in rows:
        assert 0.0 <= float(r["score"]) <= 1.0
        for value in r.values():
            assert not value.startswith(("=", "+", "-", "@")) and not any(ord(ch) < 32 for ch in value)
    assert {"'" + f for f in FORMULAS} | {"ctlred", "class/good", "sec2/good"} <= learners
    with open(report.with_name("grades.files.csv"), newline="", encoding="utf-8") as f:
        files = {r["path"]: r for r in csv.DictReader(f)}
    assert tuple(next(iter(files.values()))) == FILE_COLUMNS
    assert files["class/.sneaky"]["reason"].startswith("隐藏") and files[f"class/{NAME}"]["reason"].startswith("不在学员")
    assert files[f"class/symlink/{NAME}"]["status"] == "refused"
    assert files["class/good/.ipynb_checkpoints"]["reason"].startswith("隐藏")
    assert files["class/dup/01_fixture (1).ipynb"]["reason"].startswith("重复")
    assert files["class/good/notes.txt"]["reason"].startswith("不是 notebook")
    feedback = sorted(p.name for p in report.with_name("grades_feedback").glob("*.md"))
    assert len(feedback) == len(learners)
    pages = sorted(p.name for p in report.with_name("grades_feedback").iterdir() if p.suffix != ".md")
    assert pages == sorted(name.removesuffix(".md") + ".html" for name in feedback)   # one HTML page per learner too
    rates = list(csv.DictReader(open(report.with_name("grades.pass_rate.csv"), encoding="utf-8")))
    assert {r["check"] for r in rates} == {"check-add", "check-square", "check-answers", "check-cube"}
