"""The homework graded at class scale: ONE grader call over a fixture class, notebooks and homework together.

The learners' scripts are H1's torch-free fakes (``tests/fixtures/homework_fake``) made
self-contained: each script is the fake's source with its last line calling ``main`` with the
learner's level and bug, so a learner's folder needs nothing outside it (the sandbox shows a
script nothing else). The course of this test (``course/solutions``: the two fixture notebooks
and the reference scripts; ``course/notebooks/homework``: the baseline everyone starts from, the
fakes unchanged) is built in a temporary folder. The reference ``train_cifar.py`` carries a block
of its own code, so a learner who copies it is flagged by the similarity report.

The class: complete in the three forms (``homework/`` folder, clone with one commit per upgrade,
bundle of that history), each upgrade missing in turn, a wrong EMA, logging without clipping,
no RNG state, every upgrade squashed into one commit, a copy of the reference, and the hostile
scripts (read the reference or another learner, write outside, leave children, sleep forever,
print a fake success line, exit 0 without training, a copied metrics.jsonl, metrics.jsonl a
symlink to a host file, fill the disk, fill the process table). Every learner's row and every
upgrade's verdict are asserted, the class folder's and a canary's checksums are unchanged, and no
process of the class survives.
"""
from __future__ import annotations

import csv
import hashlib
import json
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
from course_grader import homework as grade_homework, upgrades
from course_tools.checks import homework_runs, nb10_homework
from course_grader.collect import collect
from course_grader.homework import HOMEWORK_LIMITS, NOTEBOOK
from course_tools.release import learner_notebook

ROOT = Path(__file__).resolve().parent.parent
FAKES = ROOT / "tests" / "fixtures" / "homework_fake"
FIXTURE = ROOT / "tests" / "fixtures" / "grading" / "solutions"
TRAIN, HEALTHY, TWIN = nb10_homework.TRAIN, nb10_homework.HEALTHY, nb10_homework.TWIN
_MAIN = 'if __name__ == "__main__":\n    sys.exit(main())\n'
MARKER = "hw-class-marker-7f3a"   # in the command line of every process a hostile script leaves behind
# Code only the reference has (a learner who copies the reference carries it).
_REFERENCE_ONLY = '''

def summarise_reference_run(records: list, window: int = 5) -> dict:
    """The reference's own report of a run: best and last losses, a moving average, the clipped share."""
    losses = [r["loss"] for r in records if r.get("split", "train") == "train"]
    clipped = [bool(r.get("clipped")) for r in records if "clipped" in r]
    smooth = []
    for end in range(1, len(losses) + 1):
        chunk = losses[max(0, end - window):end]
        smooth.append(sum(chunk) / len(chunk))
    evals = [r for r in records if r.get("split") == "val"]
    best = min(evals, key=lambda r: r["loss"]) if evals else None
    return {"best_loss": min(losses) if losses else None, "last_loss": losses[-1] if losses else None,
            "smooth_last": smooth[-1] if smooth else None, "clipped_share": sum(clipped) / max(1, len(clipped)),
            "best_eval_step": best["step"] if best else None, "ema_gain": (best or {}).get("acc_ema", 0.0)
            - (best or {}).get("acc", 0.0)}
'''


def _source(name: str) -> str:
    return (FAKES / name).read_text(encoding="utf-8")


def script(fake: str, prelude: str = "", **call) -> str:
    """The fake ``fake`` (file name) as one learner's script: ``prelude`` (an attack) first, then ``main(**call)``.

    The call's arguments are one JSON string, so every learner's last line tokenises the same as the
    baseline's (strings are normalised): the similarity report sees only what a learner really added.
    """
    source = _source(fake)
    assert source.endswith(_MAIN), f"{fake} no longer ends with the line this test replaces"
    body = f'if __name__ == "__main__":\n{_indent(prelude)}    sys.exit(main(**json.loads({json.dumps(call)!r})))\n'
    return source[: -len(_MAIN)] + body


def _indent(code: str) -> str:
    return "".join(f"    {line}\n" for line in code.splitlines())


def homework(level: int = 5, bug: str | None = None, overfit: bool = True, prelude: str = "") -> dict[str, str]:
    files = {TRAIN: script("fake_train.py", prelude, level=level, bug=bug)}
    if overfit:
        files[HEALTHY] = script("fake_overfit.py", twin=False)
        files[TWIN] = script("fake_overfit.py", twin=True)
    return files


def reference() -> dict[str, str]:
    files = homework()
    head, main = files[TRAIN].rsplit('if __name__ == "__main__":', 1)
    files[TRAIN] = f'{head}{_REFERENCE_ONLY.strip()}\n\n\nif __name__ == "__main__":{main}'
    return files


def baseline() -> dict[str, str]:
    """The scripts everyone starts from: train_cifar.py with no upgrade done, and (shared starter code of this
    fixture, so the similarity report sees only what learners wrote) the overfit fakes."""
    return {TRAIN: script("fake_train.py", level=0), HEALTHY: script("fake_overfit.py", twin=False),
            TWIN: script("fake_overfit.py", twin=True)}


def write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def make_course(root: Path) -> Path:
    """``root/solutions`` (fixture notebooks + reference scripts) and ``root/notebooks/homework`` (the baseline)."""
    solutions = root / "solutions"
    solutions.mkdir(parents=True)
    for path in FIXTURE.glob("*.ipynb"):
        shutil.copy(path, solutions / path.name)
    write(solutions / "homework", reference())
    write(root / "notebooks" / "homework", baseline())
    return solutions


def git(repo: Path, *args: str) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(repo), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
           "LC_ALL": "C"}
    return subprocess.run(["git", "-c", "user.name=learner", "-c", "user.email=l@example.com", "-c",
                           "init.defaultBranch=homework-0.4", *args], cwd=repo, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def clone(folder: Path, commits: list[tuple[str, dict[str, str]]]) -> Path:
    """A learner's clone: the released train_cifar.py committed (the workbook's start), then ``commits``
    (subject, files) on top."""
    write(folder / "notebooks" / "homework", {TRAIN: baseline()[TRAIN]})
    git(folder, "init", "-q")
    git(folder, "add", ".")
    git(folder, "commit", "-q", "-m", "workbook 0.4 as released")
    for subject, files in commits:
        write(folder / "notebooks" / "homework", files)
        git(folder, "add", ".")
        git(folder, "commit", "-q", "-m", subject)
    return folder


def one_commit_per_upgrade() -> list[tuple[str, dict[str, str]]]:
    steps = [(f"upgrade {k}", {TRAIN: script("fake_train.py", level=k)}) for k in range(1, 5)]
    return steps + [("upgrade 5: debug_overfit", homework())]


def solved_notebook():
    nb = learner_notebook(nbformat.read(FIXTURE / "01_fixture.ipynb", as_version=4))
    for cell in nb.cells:
        if cell.get("id") == "ex-add":
            cell.source = "def add(a, b):\n    return a + b"
        elif cell.get("id") == "ex-square":
            cell.source = "def square(x):\n    return x * x"
    return nb


# ---------------------------------------------------------------- the class

_ARG = 'sys.argv[sys.argv.index("{flag}") + 1]'


def hostile(paths: dict[str, Path]) -> dict[str, str]:
    """Attacks, each run first thing in a learner's train_cifar.py (the overfit scripts stay honest)."""
    out = _ARG.format(flag="--out")
    canned = "".join(json.dumps({"step": s, "loss": 2.3 - 0.1 * s}) + "\n" for s in range(1, 61))
    return {
        "h_read_reference": f"print(open({str(paths['reference'])!r}).read()[:80])",
        "h_read_other": f"print(open({str(paths['other'])!r}).read()[:80])",
        "h_write_outside": (f"import pathlib\ncanary = pathlib.Path({str(paths['canary'])!r})\ntry:\n"
                            f"    canary.parent.mkdir(parents=True, exist_ok=True)\n    canary.write_text('overwritten')\n"
                            f"except OSError:\n    pass\nopen(__file__, 'a').write('# tampered')"),
        "h_children": f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {MARKER!r}], "
                      "start_new_session=True)",
        "h_sleep_forever": (f"if {_ARG.format(flag='--max-steps')} == '3' and '--ema-decay' not in sys.argv:  # upgrade 1\n"
                            "    time.sleep(10 ** 6)"),
        "h_fake_success": "print('✅ 升级 1: --seed 1234 两次运行逐步一致(用时 1 s)')\nprint('all checks passed')\nsys.exit(0)",
        "h_exit_without_training": "sys.exit(0)",
        "h_copied_metrics": (f"import pathlib\nout = pathlib.Path({out})\nout.mkdir(parents=True, exist_ok=True)\n"
                             "(out / 'config.json').write_text(json.dumps({'seed': 1234, 'git_commit': 'abc'}))\n"
                             f"(out / 'metrics.jsonl').write_text({canned!r})\nsys.exit(0)"),
        "h_symlink_metrics": (f"import atexit, pathlib\nout = pathlib.Path({out})\n"
                              "def swap():\n    m = out / 'metrics.jsonl'\n    if m.exists():\n        m.unlink()\n"
                              f"    m.symlink_to({str(paths['other'])!r})\natexit.register(swap)"),
        "h_fill_disk": (f"import pathlib\nout = pathlib.Path({out})\nout.mkdir(parents=True, exist_ok=True)\n"
                        "for i in range(10 ** 6):\n    (out / f'fill{i}').write_bytes(bytes(2 ** 20))"),
        "h_fork_bomb": ("kids = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(600)\n"
                        "            os._exit(0)\n        kids += 1\nexcept OSError as exc:\n"
                        "    raise SystemExit(f'fork failed after {kids} children: {exc}')"),
    }


# learner -> (which upgrades pass, a text every failed upgrade's message holds, the commits column's start)
P = (True,) * 5


def _all_but(*failed: int) -> tuple[bool, ...]:
    return tuple(k not in failed for k in range(1, 6))


HOSTILE_FAILS_1_TO_4 = {"h_read_reference": "FileNotFoundError", "h_read_other": "FileNotFoundError",
                        "h_write_outside": "Read-only file system", "h_fake_success": "实际 没有",
                        "h_exit_without_training": "实际 没有", "h_copied_metrics": "",
                        "h_symlink_metrics": "符号链接", "h_fill_disk": "运行目录写入超过",
                        "h_fork_bomb": "fork failed"}


def make_class(root: Path, fork_bomb: bool) -> tuple[Path, dict[str, tuple[tuple[bool, ...], str, str]]]:
    """The class folder and what each learner's homework row must be."""
    c = root / "class"
    expected: dict[str, tuple[tuple[bool, ...], str, str]] = {}
    write(c / "full_folder" / "homework", homework())
    nbformat.write(solved_notebook(), c / "full_folder" / "01_fixture.ipynb")
    expected["full_folder"] = (P, "", "无历史")
    clone(c / "full_clone", one_commit_per_upgrade())
    nbformat.write(solved_notebook(), c / "full_clone" / "notebooks" / "01_fixture.ipynb")
    expected["full_clone"] = (P, "", "合格")
    work = clone(root / "work" / "full_bundle", one_commit_per_upgrade())
    (c / "full_bundle").mkdir(parents=True)
    git(work, "bundle", "create", str(c / "full_bundle" / "hw.bundle"), "homework-0.4")
    expected["full_bundle"] = (P, "", "合格")
    clone(c / "squashed", [("all upgrades", homework())])
    expected["squashed"] = (P, "", "不合格")
    write(c / "missing_1" / "homework", homework(bug="no_config"))
    expected["missing_1"] = (_all_but(1), "config.json", "无历史")
    write(c / "missing_2" / "homework", homework(bug="resume_restarts"))
    expected["missing_2"] = (_all_but(2, 4), "", "无历史")
    write(c / "missing_3" / "homework", homework(bug="no_clipped"))
    expected["missing_3"] = (_all_but(3), "clipped", "无历史")
    write(c / "missing_4" / "notebooks" / "homework", homework(level=3))   # a clone without .git
    expected["missing_4"] = (_all_but(4), "--ema-decay", "无历史")
    write(c / "missing_5" / "homework", homework(overfit=False))
    expected["missing_5"] = (_all_but(5), HEALTHY, "无历史")
    write(c / "wrong_ema" / "homework", homework(bug="ema_not_saved"))
    expected["wrong_ema"] = (_all_but(4), "loss_ema", "无历史")
    write(c / "clip_noop" / "homework", homework(bug="clip_noop"))
    expected["clip_noop"] = (_all_but(3), "", "无历史")
    write(c / "no_rng" / "homework", homework(bug="no_rng_state"))
    expected["no_rng"] = (_all_but(2, 4), "", "无历史")
    write(c / "copy" / "homework", reference())
    expected["copy"] = (P, "", "无历史")
    paths = {"reference": root / "course" / "solutions" / "homework" / TRAIN,
             "other": c / "full_folder" / "homework" / TRAIN, "canary": root / "canary" / "canary.txt"}
    for name, prelude in hostile(paths).items():
        if name == "h_fork_bomb" and not fork_bomb:
            continue
        write(c / name / "homework", homework(prelude=prelude))
        fails = HOSTILE_FAILS_1_TO_4.get(name)
        expected[name] = ((_all_but(1, 2, 3, 4), fails, "无历史") if fails is not None else
                          (_all_but(1), "超时", "无历史") if name == "h_sleep_forever" else (P, "", "无历史"))
    nbformat.write(solved_notebook(), write(c / "notebooks_only", {}) / "01_fixture.ipynb")
    expected["notebooks_only"] = ((False,) * 5, "未提交作业", "")
    return c, expected


# ---------------------------------------------------------------- one grader call


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): ("link:" + os.readlink(p) if p.is_symlink() else
                                         hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(folder.rglob("*"))}


def _survivors() -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if MARKER.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


TEST_LIMITS = sandbox.Limits(memory=HOMEWORK_LIMITS.memory, resident=HOMEWORK_LIMITS.resident, pids=64,
                             file_size=8 * sandbox.MiB, disk=16 * sandbox.MiB, tmp=64 * sandbox.MiB,
                             shm=64 * sandbox.MiB, home=16 * sandbox.MiB)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap (Debian package 'bubblewrap', command bwrap)")
    sandbox.check_available()
    cgroup = sandbox.Cgroup.create(TEST_LIMITS)   # the fork bomb only where a pids cgroup contains it
    if cgroup:
        cgroup.close()
    root = tmp_path_factory.mktemp("homework-class")
    solutions = make_course(root / "course")
    (root / "canary").mkdir()
    (root / "canary" / "canary.txt").write_text("untouched")
    c, expected = make_class(root, fork_bomb=cgroup is not None)
    before = {"class": _snapshot(c), "course": _snapshot(root / "course"), "canary": _snapshot(root / "canary")}
    report = root / "report" / "grades.csv"
    mp = pytest.MonkeyPatch()
    mp.setattr(homework_runs, "CPU_LIMIT", 10)   # CPU seconds: an honest run takes a few
    mp.setattr(homework_runs, "WALL_FACTOR", 2)  # the script that sleeps forever: stopped after 20 s
    try:
        start = time.monotonic()
        grades = grade.grade_all([c], solutions, grade.Options(jobs=4, cell_timeout=30, timeout=60,
                                                               homework_limits=TEST_LIMITS), report, verbose=False)
        seconds = time.monotonic() - start
    finally:
        mp.undo()
    after = {"class": _snapshot(c), "course": _snapshot(root / "course"), "canary": _snapshot(root / "canary")}
    return {"grades": grades, "expected": expected, "report": report, "before": before, "after": after,
            "seconds": seconds, "survivors": _survivors()}


@pytest.mark.slow
def test_every_homework_row_is_exactly_as_expected(graded):
    rows = {g.learner: g for g in graded["grades"] if g.notebook == NOTEBOOK}
    assert sorted(rows) == sorted(graded["expected"])
    for learner, (flags, text, commits) in graded["expected"].items():
        g = rows[learner]
        assert tuple(c.passed for c in g.checks) == flags, (learner, [c.message for c in g.checks])
        assert (g.passed, g.total) == (sum(flags), 5), learner
        assert g.commits.startswith(commits), (learner, g.commits)
        for check in g.checks:
            if not check.passed:
                assert text in check.message, (learner, check.message)
                assert "复现" in check.message or learner == "notebooks_only", (learner, check.message)
    assert "升级 1+2+3+4+5 在同一提交" in rows["squashed"].commits
    assert any("升级 3: " in n and "upgrade 3" in n for n in rows["full_bundle"].notes), rows["full_bundle"].notes
    assert "未沙箱" not in " ".join(rows["full_folder"].notes)


@pytest.mark.slow
def test_notebooks_and_homework_graded_together(graded):
    by = {(g.learner, g.notebook): g for g in graded["grades"]}
    for learner in ("full_folder", "full_clone", "notebooks_only"):
        assert by[learner, "01_fixture.ipynb"].passed == 2, learner
    assert by["full_bundle", "01_fixture.ipynb"].notes == ["未提交 01_fixture.ipynb"]   # homework only: 0, no error
    assert by["notebooks_only", NOTEBOOK].notes == ["未提交作业(homework/ 文件夹、练习册克隆或 *.bundle)"]


@pytest.mark.slow
def test_reports_name_the_form_rates_feedback_and_similarity(graded):
    report = graded["report"]
    files = {(r["learner"], r["status"], r["reason"]) for r in csv.DictReader(open(report.with_name("grades.files.csv"),
                                                                                   encoding="utf-8"))}
    for learner, form in (("full_folder", "homework/ 文件夹"), ("full_clone", "含 .git"), ("full_bundle", "bundle"),
                          ("missing_4", "没有 .git")):
        assert any(l == learner and s == "graded" and form in r for l, s, r in files), (learner, form)
    rates = {r["check"]: r for r in csv.DictReader(open(report.with_name("grades.pass_rate.csv"), encoding="utf-8"))
             if r["notebook"] == NOTEBOOK}
    rows = [g for g in graded["grades"] if g.notebook == NOTEBOOK and g.learner != "notebooks_only"]
    for k, (label, rate) in enumerate(sorted(rates.items()), start=1):
        assert label.startswith(f"升级 {k}: ")
        assert int(rate["passed"]) == sum(g.checks[k - 1].passed for g in rows) and int(rate["graded"]) == len(rows)
    feedback = (report.parent / "grades_feedback" / "wrong_ema.md").read_text(encoding="utf-8")
    assert "## 10_homework.ipynb: 4/5" in feedback and "❌ 升级 4" in feedback and "loss_ema" in feedback
    sim = list(csv.DictReader(open(report.with_name("grades.similarity.csv"), encoding="utf-8")))
    flagged = {(r["learner"], r["other"]) for r in sim if r["flagged"] == "1"}
    assert ("copy", "solutions/homework") in flagged
    honest = {name for name in graded["expected"] if not name.startswith("h_")}
    assert {pair for pair in flagged if set(pair) <= honest | {"solutions/homework"}} == {("copy", "solutions/homework")}


@pytest.mark.slow
def test_nothing_outside_the_sandboxes_changed_and_nothing_survives(graded):
    assert graded["after"] == graded["before"]
    assert graded["survivors"] == []


# ---------------------------------------------------------------- the parts, fast

def test_collect_finds_each_form_and_keeps_one(tmp_path):
    c = tmp_path / "class"
    write(c / "ann" / "homework", homework())
    write(c / "ben" / "notebooks" / "homework", homework())                  # ben is a clone without .git
    nbformat.write(solved_notebook(), c / "ben" / "notebooks" / "01_fixture.ipynb")
    (c / "ben" / "solutions").mkdir()
    nbformat.write(solved_notebook(), c / "ben" / "solutions" / "01_fixture.ipynb")   # the clone's reference: not looked at
    clone(c / "cat" / "workbook", one_commit_per_upgrade())                  # a clone inside the learner folder
    write(c / "cat" / "homework", homework())                                # and a second form
    (c / "dan").mkdir()
    git(clone(tmp_path / "dan", one_commit_per_upgrade()), "bundle", "create", str(c / "dan" / "hw.bundle"),
        "homework-0.4")
    refs = [FIXTURE / "01_fixture.ipynb"]
    items, findings = collect([c], refs, homework=NOTEBOOK)
    hw = {i.learner: i for i in items if i.reference.name == NOTEBOOK}
    assert {k: (i.form, i.path.name) for k, i in hw.items()} == {
        "ann": ("folder", "homework"), "ben": ("clone", "ben"), "cat": ("clone-git", "workbook"),
        "dan": ("bundle", "hw.bundle")}
    assert hw["cat"].review and "未批改 class/cat/homework" in hw["cat"].review[0]
    nb = {i.learner: i for i in items if i.reference.name == "01_fixture.ipynb"}
    assert nb["ben"].path == c / "ben" / "notebooks" / "01_fixture.ipynb" and nb["ben"].notes == []
    assert not any("solutions" in f.path for f in findings)
    items, _ = collect([c / "ben"], refs, homework=NOTEBOOK)                 # a clone given as the learner folder
    assert [(i.learner, i.form) for i in items if i.reference.name == NOTEBOOK] == [("ben", "clone")]


def test_script_box_shows_only_its_folders_and_dies_whole(sandbox_ready, tmp_path):
    scripts, run, outside = tmp_path / "scripts", tmp_path / "run", tmp_path / "outside.txt"
    outside.write_text("host")
    run.mkdir()
    probe = write(scripts, {"probe.py": f"""
import os, subprocess, sys, time
assert os.getcwd() == {str(scripts)!r} and os.getenv("SECRET") is None and os.getenv("OWN") == "1"
assert not os.path.exists({str(outside)!r}), "a host file is visible"
for target in ({str(scripts / 'probe.py')!r}, "/usr/x"):
    try:
        open(target, "a")
    except OSError:
        pass
    else:
        raise AssertionError(target + " writable")
open({str(run / 'ok')!r}, "w").write("written")
open("beside.txt", "w").write("private")                # beside the script: the sandbox's own tmpfs
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", {MARKER!r}], start_new_session=True)
print("ready", flush=True)
time.sleep(600)
"""}) / "probe.py"
    box = sandbox.ScriptBox((scripts,), limits=TEST_LIMITS)
    env = {**os.environ, "OWN": "1", "SECRET": "instructor-token"}
    os.environ["SECRET"] = "instructor-token"
    try:
        with open(tmp_path / "log", "w") as log:
            proc = box([sys.executable, str(probe)], cwd=scripts, env=env, stdout=log, writable=run)
        deadline = time.monotonic() + 60
        while "ready" not in (tmp_path / "log").read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, (tmp_path / "log").read_text()
        assert _survivors()                         # the detached child runs ...
        os.killpg(proc.pid, 9)
        proc.wait()
        for _ in range(100):                        # ... and dies with the sandbox
            if not _survivors():
                break
            time.sleep(0.05)
        assert _survivors() == []
    finally:
        del os.environ["SECRET"]
        box.close()
    assert (run / "ok").read_text() == "written" and outside.read_text() == "host"
    assert sorted(p.name for p in scripts.iterdir()) == ["probe.py"]


def test_first_passing_commit_by_binary_search_with_a_bounded_number_of_runs():
    from course_grader.commits import Commit

    commits = [Commit(f"{k:040x}", f"{k:07x}", f"c{k}") for k in range(1, 9)]
    upgrade = nb10_homework.UPGRADES[1]
    for first in range(len(commits)):
        runner = upgrades._Runner.__new__(upgrades._Runner)
        runner.memo, calls = {}, []

        def at(u, commit, first=first, calls=calls):
            calls.append(commit.sha)
            return commits.index(commit) >= first

        runner.at = at
        runner.started = lambda u, commit: True     # nothing known from --help: probe the oldest, then halve
        assert runner.first_pass(upgrade, commits) == commits[first]
        assert len(calls) <= 1 + 1 + 3              # the newest, the oldest started, then log2(8) halvings
        calls.clear()
        runner.started = lambda u, commit, first=first: commits.index(commit) >= first   # --help tells
        assert runner.first_pass(upgrade, commits) == commits[first]
        assert calls == [commits[-1].sha] + ([commits[first].sha] if first < len(commits) - 1 else [])
    runner.at = lambda u, commit: False
    assert runner.first_pass(upgrade, commits) is None


@pytest.fixture(scope="module")
def sandbox_ready():
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap (Debian package 'bubblewrap', command bwrap)")
    sandbox.check_available()


def test_require_commits_changes_the_score_only_when_asked(tmp_path, monkeypatch):
    from course_grader.collect import Item
    from course_grader.report import CheckOutcome
    from course_grader.upgrades import UPGRADE_LABELS

    async def graded(steps, result, verdict):
        result.grade.checks = [CheckOutcome(label, True) for label in UPGRADE_LABELS]
        result.grade.commits = verdict

    item = Item("ann", Path(NOTEBOOK), tmp_path, form="bundle")
    for verdict, required, score in (("不合格: 升级 1+2 在同一提交", False, 5), ("不合格: 升级 1+2 在同一提交", True, 0),
                                     ("合格: 5 个升级各自一个提交, 顺序正确", True, 5), ("无历史 (普通文件夹, 不计)", True, 5)):
        monkeypatch.setattr(grade_homework, "run_steps", lambda *a, v=verdict: graded(*a, v))
        setup = grade_homework.HomeworkSetup(tmp_path, tmp_path, require_commits=required)
        result = grade_homework.grade_homework(item, setup, sandbox=True, private=tmp_path)
        assert result.grade.passed == score, (verdict, required)
        assert any("--require-commits" in n for n in result.grade.notes) == (score == 0)


_PARSER = '''import argparse, time
p = argparse.ArgumentParser()
for flag in {flags!r}:
    p.add_argument(flag)
{extra}p.parse_args()
'''


@pytest.mark.slow
def test_the_walk_runs_no_check_where_the_help_lists_none_of_the_upgrades_flags(sandbox_ready, tmp_path, monkeypatch):
    # Torch-free scripts: --help answers at once (or never). Upgrade 3 adds --clip; upgrade 5 adds two scripts.
    from course_grader.commits import open_history
    from tests.support.git_history import commit_file, git

    repo = tmp_path / "learner"
    repo.mkdir()
    git(repo, "init", "-q")
    script = f"{grade_homework.HOMEWORK}/train_cifar.py"
    versions = [((), ""), (("--out", "--seed"), ""), (("--out", "--seed", "--clip"), ""),
                (("--out", "--seed", "--clip"), "time.sleep(600)\n")]      # the last one hangs on --help
    for k, (flags, extra) in enumerate(versions):
        commit_file(repo, script, _PARSER.format(flags=flags, extra=extra), f"v{k}")
    history = open_history(repo, tmp_path / "git", course=None, baseline=_PARSER.format(flags=(), extra="").encode())
    commits = history.commits
    assert [c.subject for c in commits] == ["v1", "v2", "v3"]
    setup = grade_homework.HomeworkSetup(tmp_path / "none", tmp_path / "none")
    runner = upgrades._Runner(setup, True, tmp_path / "scratch", history)
    (tmp_path / "scratch").mkdir()
    config, clipping, overfit = (nb10_homework.UPGRADES[k] for k in (0, 2, 4))
    assert [runner.started(config, c) for c in commits[:2]] == [True, True]
    assert [runner.started(clipping, c) for c in commits[:2]] == [False, True]     # --clip only from v2
    assert runner.started(overfit, commits[0]) is False                             # debug_overfit.py missing
    assert len(runner.helps) == 2 and runner.runs == 0                              # two --help, no check run
    monkeypatch.setattr(upgrades, "HELP_TIMEOUT", 2.0)
    start = time.monotonic()
    assert runner.started(clipping, commits[2]) is True       # a --help that hangs proves nothing: the check runs
    assert time.monotonic() - start < 15 and runner.helps[commits[2].sha] is None
    monkeypatch.setattr(upgrades, "help_text", lambda *a, **k: pytest.fail("asked again"))
    runner.helps.pop(commits[1].sha)
    assert runner.started(clipping, commits[1]) is True       # after one hang, --help is not asked again


def test_a_check_runs_once_per_content_of_the_scripts(tmp_path):
    # A revert brings back scripts the walk has checked: the same bytes are not run again (except for
    # upgrade 1, whose check reads the commit itself).
    from course_grader.commits import open_history
    from course_grader.report import CheckOutcome
    from tests.support.git_history import commit_file, git

    repo = tmp_path / "learner"
    repo.mkdir()
    git(repo, "init", "-q")
    script = f"{grade_homework.HOMEWORK}/train_cifar.py"
    for k, text in enumerate(["base\n", "a\n", "b\n", "a\n"]):
        commit_file(repo, script, text, f"v{k}")
    history = open_history(repo, tmp_path / "git", course=None, baseline=b"base\n")
    runner = upgrades._Runner(None, False, tmp_path / "scratch", history)
    (tmp_path / "scratch").mkdir()
    ran = []

    def check(upgrade, folder, commit):
        ran.append((upgrade.number, (folder / "train_cifar.py").read_text()))
        return CheckOutcome("x", True)

    runner.check = check
    first, _, revert = history.commits
    for upgrade in (nb10_homework.UPGRADES[1], nb10_homework.UPGRADES[0]):
        assert runner.at(upgrade, first) and runner.at(upgrade, revert)
    assert ran == [(2, "a\n"), (1, "a\n"), (1, "a\n")]
