"""The progress ledger records every check, survives corruption and concurrent kernels, stays inside the
grader's sandbox, and feeds a dashboard (text, HTML, and the HTML rendered by headless Chromium)."""
from __future__ import annotations

import html.parser
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from course_tools import ledger as ledger_module, progress
from course_tools.cells import NOTEBOOK_GLOB
from course_tools.checks import CheckFailed
from course_tools.checks.nb08_time_estimate import check_estimate_hours
from tests.support.notebook_cells import ROOT, tagged_sources

RIGHT = "def estimate_hours(n, e, b, s):\n    return n * e / b / s / 3600\n"
WRONG = "def estimate_hours(n, e, b, s):\n    return n * e / s / 3600\n"  # the batch size forgotten
KEY = "nb08_time_estimate.check_estimate_hours"


@pytest.fixture(autouse=True)
def ledger(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "ledger" / ".progress.json"
    monkeypatch.setenv("COURSE_PROGRESS", str(path))
    ledger_module._noted.clear()
    return path


def _fn(source: str):
    namespace: dict = {}
    exec(source, namespace)
    return namespace["estimate_hours"]


def test_a_passing_check_is_recorded_under_its_notebook_and_name(ledger):
    check_estimate_hours(_fn(RIGHT))
    entry = json.loads(ledger.read_text())["checks"][KEY]
    assert entry["passed"] is True and entry["passes"] == 1 and entry["last"] == "passed"
    with pytest.raises(CheckFailed) as info:
        check_estimate_hours(_fn(WRONG))
    assert info.value.check == KEY  # a failure knows its check; it is recorded where it is shown (the kernel test)


def test_switched_off_records_nothing(ledger, monkeypatch):
    monkeypatch.setenv("COURSE_PROGRESS", "off")
    check_estimate_hours(_fn(RIGHT))
    assert ledger_module.ledger_path() is None and not ledger.parent.exists()


def test_a_corrupt_ledger_is_moved_aside_with_one_note_and_recording_goes_on(ledger, capsys):
    ledger.parent.mkdir()
    ledger.write_text("{ this is not json")
    check_estimate_hours(_fn(RIGHT))
    ledger_module.record_check(KEY, True)
    notes = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(notes) == 1 and "无法读取" in notes[0], notes
    assert ledger.with_name(".progress.json.corrupt").read_text() == "{ this is not json"
    assert json.loads(ledger.read_text())["checks"][KEY]["passes"] == 2


def test_hand_edited_entries_are_dropped_the_rest_kept(ledger, capsys):
    ledger.parent.mkdir()
    good = {"passed": True, "passes": 1, "failures": 0, "hints": 0, "time": "2026-01-01T00:00:00"}
    ledger.write_text(json.dumps({"checks": {KEY: good, "nb01_amp.check_amp_train_step": {"passed": "yes"},
                                             "not a key": good}, "quizzes": {"q": {"answers": 3}}}))
    ledger_module.record_check("nb02_grad_clipping.check_global_clip", False)
    assert "看不懂的条目" in capsys.readouterr().err
    data = json.loads(ledger.read_text())
    assert set(data["checks"]) == {KEY, "nb02_grad_clipping.check_global_clip"} and data["quizzes"] == {}
    assert data["checks"][KEY] == good


def test_a_ledger_written_before_a_check_module_was_renamed_keeps_its_entries(ledger):
    """09's checks lived in ``nb09_quiz`` (now ``nb09_self_test``): a learner's earlier passes still count."""
    ledger.parent.mkdir()
    good = {"passed": True, "passes": 1, "failures": 0, "hints": 0, "time": "2026-01-01T00:00:00"}
    ledger.write_text(json.dumps({"checks": {"nb09_quiz.check_ema_start_weight": good}, "quizzes": {}}))
    assert ledger_module.load()["checks"] == {"nb09_self_test.check_ema_start_weight": good}
    ledger_module.record_check("nb09_self_test.check_ema_start_weight", True)
    assert json.loads(ledger.read_text())["checks"]["nb09_self_test.check_ema_start_weight"]["passes"] == 2


def test_an_unwritable_place_never_fails_a_check(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("COURSE_PROGRESS", str(blocker / "sub" / ".progress.json"))  # a parent that is a file
    check_estimate_hours(_fn(RIGHT))
    assert capsys.readouterr().err == ""


_HAMMER = textwrap.dedent("""
    import sys
    from course_tools.ledger import record_check, record_hint
    me, rounds = sys.argv[1], int(sys.argv[2])
    for i in range(rounds):
        record_check("nb01_amp.check_shared", i % 2 == 0)
        record_check(f"nb01_amp.check_{me}", True)
        record_hint("nb01_amp.check_shared", i % 3 + 1)
""")


def test_two_kernels_writing_at_once_lose_nothing(ledger):
    rounds = 60
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", _HAMMER, name, str(rounds)], env=env, cwd=ROOT)
             for name in ("a", "b")]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    checks = json.loads(ledger.read_text())["checks"]
    shared = checks["nb01_amp.check_shared"]
    assert shared["passes"] + shared["failures"] == 2 * rounds and shared["passes"] == rounds
    assert shared["hints"] == 3
    assert checks["nb01_amp.check_a"]["passes"] == checks["nb01_amp.check_b"]["passes"] == rounds
    assert not [p.name for p in ledger.parent.iterdir() if ".tmp" in p.name]


def test_the_quiz_records_each_verdict(ledger):
    from course_tools.quiz import Question, Quiz

    quiz = Quiz([Question("q1", "1+1?", kind="number", answer=2), Question("q2", "2+2?", kind="number", answer=4),
                 Question("q3", "为什么?", kind="text", keywords=(("因为",),))], title="测验")
    quiz.grade({"q1": 2, "q2": 5, "q3": "因为"}, verbose=False)       # q3, a short answer, is not scored
    quiz.grade({"q2": 4}, verbose=False)
    assert json.loads(ledger.read_text())["quizzes"]["测验"]["answers"] == {"q1": True, "q2": True}
    assert "测验: 答对 2/2" in progress.text()


def test_the_plain_text_self_test_records_its_score(ledger):
    # 09's graded answers never pass through the quiz widget: check_self_test_answers records the verdicts itself
    from course_tools.checks.nb09_self_test import GRADED_IDS, QUIZ, check_self_test_answers

    right = {qid: QUIZ.by_id[qid].answer for qid in GRADED_IDS}
    with pytest.raises(CheckFailed, match="未作答 q2"):
        check_self_test_answers(lambda: {**{q: a for q, a in right.items() if q != "q2"}, "q1": "A"})
    answers = json.loads(ledger.read_text())["quizzes"][QUIZ.title]["answers"]
    assert "q2" not in answers and answers["q1"] is False and sum(answers.values()) == len(GRADED_IDS) - 2
    check_self_test_answers(lambda: right)
    assert f"{QUIZ.title}: 答对 {len(GRADED_IDS)}/{len(GRADED_IDS)}" in progress.text()  # q12 is not scored


def test_every_released_check_cell_is_an_exercise_with_a_real_check_and_section():
    import importlib

    found = progress.exercises()
    cells = sum(1 for path in (ROOT / "notebooks").glob(NOTEBOOK_GLOB)
                for c in nbformat.read(path, as_version=4).cells if "check" in c.get("metadata", {}).get("tags", []))
    assert len(found) >= cells > 0
    for ex in found:
        module, name = ex.check.split(".")
        assert callable(getattr(importlib.import_module(f"course_tools.checks.{module}"), name)), ex
        assert ex.notebook.split("_")[0] == module[2:].split("_")[0] and ex.section and ex.link.startswith(f"{ex.notebook}.ipynb#"), ex


def _ledger_with(passed: list[str]) -> dict:
    entry = {"passed": True, "passes": 1, "failures": 0, "hints": 2, "time": "2026-01-01T00:00:00", "last": "passed"}
    return {"checks": {k: dict(entry) for k in passed},
            "quizzes": {"0.4 训练工程常识 · 自测题": {"answers": {"q1": True, "q2": False}, "total": 11}}}


def test_dashboard_counts_passes_scores_upgrades_and_names_the_next_exercise():
    found = progress.exercises()
    first_nb = [ex for ex in found if ex.notebook == found[0].notebook]
    ledger = _ledger_with([ex.check for ex in first_nb] + ["nb10_homework.check_config"])
    rows = {r.notebook: r for r in progress.dashboard(ledger)}
    assert (rows[found[0].notebook].done, rows[found[0].notebook].total) == (len(first_nb), len(first_nb))
    homework = rows["10_homework"]
    assert (homework.done, homework.total) == (1, 5) and "1✅ 2·" in homework.detail
    assert "答对 1/11" in rows[[n for n in rows if n.startswith("09")][0]].detail
    nxt = progress.next_exercise(ledger)
    assert nxt == found[len(first_nb)]
    assert f"notebooks/{nxt.notebook}.ipynb 的「{nxt.section}」" in progress.text(ledger)
    assert "下一个没做的" in progress.text(ledger) and progress.SCROLL in progress.text(ledger)
    everything = _ledger_with([ex.check for ex in found] + [f"nb10_homework.{c}" for c in (
        "check_config", "check_resume", "check_clipping", "check_ema")])
    assert progress.next_exercise(everything).section.startswith("作业升级 5")


def test_dashboard_tells_each_state_and_sends_the_learner_where_they_are_stuck():
    found = progress.exercises()
    a, b, c, d = found[0], found[1], found[3], found[5]   # passed, regressed, stuck, not started (rest: not run)
    ledger = _ledger_with([a.check])
    ledger["checks"][b.check] = {"passed": True, "passes": 1, "failures": 1, "hints": 0, "last": "failed",
                                 "time": "2026-01-02T00:00:00"}
    ledger["checks"][c.check] = {"passed": False, "passes": 0, "failures": 3, "hints": 1, "last": "failed",
                                 "time": "2026-01-03T00:00:00"}
    ledger["checks"][d.check] = {"passed": False, "passes": 0, "failures": 0, "hints": 0, "last": "not_started",
                                 "time": "2026-01-04T00:00:00"}
    checks = ledger["checks"]
    assert [progress.state(checks.get(ex.check)) for ex in (a, b, c, d)] == \
        ["passed", "regressed", "in_progress", "not_started"]
    rows = {r.notebook: r for r in progress.dashboard(ledger)}
    assert rows[a.notebook].done == 1                                   # a regressed exercise is not counted passed
    assert f"{b.check.split('.')[1]} 通过后又失败(失败 1 次)" in rows[b.notebook].detail
    assert f"{c.check.split('.')[1]} 进行中(失败 3 次,看过 1 级提示)" in rows[c.notebook].detail
    assert progress.next_exercise(ledger) == c                          # stuck, touched last
    assert "卡在这里,失败 3 次,看过 1 级提示" in progress.text(ledger)
    checks[b.check]["time"] = "2026-01-05T00:00:00"
    assert progress.next_exercise(ledger) == b and "通过过,最近一次没通过" in progress.text(ledger)
    del checks[b.check], checks[c.check]
    assert progress.next_exercise(ledger) == found[1]                   # nothing stuck: the first not passed


class _Table(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.links: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "a":
            self.links.append(dict(attrs)["href"])

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def test_html_has_one_row_per_notebook_and_links_the_next_section():
    ledger = _ledger_with([])
    page = _Table()
    page.feed(progress.html_table(ledger))
    rows = progress.dashboard(ledger)
    assert page.rows[0] == ["笔记本", "通过", "说明"]
    assert [r[:2] for r in page.rows[1:]] == [[r.notebook, f"{r.done}/{r.total}"] for r in rows]
    first = progress.exercises()[0]
    assert page.links[-1] == first.link and first.link.startswith("01_")


def test_the_module_prints_the_dashboard(ledger):
    ledger_module.record_check("nb01_amp.check_needs_scaler", True)
    out = subprocess.run([sys.executable, "-m", "course_tools.progress"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ})
    assert out.returncode == 0, out.stderr
    assert "01_amp" in out.stdout and "1/2" in out.stdout and "check_amp_train_step" in out.stdout


def test_in_a_kernel_failures_are_recorded_and_hint_works_without_an_import(ledger):
    # the learner's copy of 08 as released: its stub (not started: nothing counted), a wrong answer, its check
    (stub, *_), (check, *_) = (tagged_sources(ROOT / "notebooks" / "08_time_estimate.ipynb", tag) for tag in ("exercise", "check"))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(stub + "\n" + check), nbformat.v4.new_code_cell(WRONG + "\n" + check),
                nbformat.v4.new_code_cell("hint()"), nbformat.v4.new_code_cell("hint()"),
                nbformat.v4.new_code_cell(RIGHT), nbformat.v4.new_code_cell("check_estimate_hours(estimate_hours)")]
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True).execute()
    shown = [o for o in nb.cells[1].outputs if o.output_type == "error"][0].traceback
    assert len(shown) <= 4 and "hint()" in shown[-1]
    from course_tools.checks.nb08_time_estimate import HINTS

    tiers = HINTS["check_estimate_hours"]
    assert tiers[0] in nb.cells[2].outputs[0].text and tiers[1] in nb.cells[3].outputs[0].text
    entry = json.loads(ledger.read_text())["checks"][KEY]
    assert (entry["failures"], entry["passes"], entry["hints"], entry["passed"]) == (1, 1, 2, True)
    assert "练习尚未完成" in [o for o in nb.cells[0].outputs if o.output_type == "error"][0].traceback[2]


_SANDBOXED = RIGHT + textwrap.dedent("""
    from course_tools.checks import CheckFailed
    from course_tools.checks.nb08_time_estimate import check_estimate_hours
    check_estimate_hours(estimate_hours)
    try:
        check_estimate_hours(lambda *a: 1.0)
    except CheckFailed as exc:
        print("FAILED", exc.check)
    from course_tools.ledger import ledger_path
    path = ledger_path()
    print("LEDGER", path, path is not None and path.exists())
""")


@pytest.mark.slow  # two sandboxed Python processes importing torch
def test_a_graded_sandboxed_run_is_unaffected_and_its_ledger_stays_inside(tmp_path):
    from course_grader import sandbox

    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap (Debian package 'bubblewrap', command bwrap)")
    inside = tmp_path / "inside" / "p.json"
    box = sandbox.ScriptBox()
    try:
        for name, env in (("default", {}), ("inside", {"COURSE_PROGRESS": str(inside)})):
            run = tmp_path / name
            run.mkdir()
            with open(tmp_path / f"{name}.log", "w+") as log:
                proc = box([sys.executable, "-c", _SANDBOXED], cwd=Path(sandbox.SANDBOX_CWD), env=env, stdout=log,
                           writable=run)
                assert proc.wait(timeout=300) == 0
                log.seek(0)
                out = log.read()
            assert "✅ estimate_hours" in out and f"FAILED {KEY}" in out and "进度记录" not in out, out
            # default: the quiet environment of every graded run switches the ledger off (COURSE_PROGRESS=off)
            assert (f"LEDGER {inside} True" if name == "inside" else "LEDGER None False") in out, out
    finally:
        box.close()
    assert json.loads(inside.read_text())["checks"][KEY]["passes"] == 1  # written in the run's own folder


def test_the_dashboard_renders_in_headless_chromium(tmp_path, ledger):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    from nbconvert import HTMLExporter

    ledger_module.record_check("nb01_amp.check_amp_train_step", True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from course_tools.progress import show\nshow()")]
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    page = tmp_path / "dashboard.html"
    page.write_text(HTMLExporter().from_notebook_node(nb)[0], encoding="utf-8")
    out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-500:]
    dom = out.stdout
    table = dom[dom.index('<div class="course-progress">'):]
    parsed = _Table()
    parsed.feed(table[:table.index("</div>") + 6])
    assert parsed.rows[1][:2] == ["01_amp", "1/2"]
    assert parsed.links[-1] == progress.exercises()[1].link


def test_every_learner_copy_ends_with_its_open_exercises(ledger, capsys):
    found = progress.exercises()
    with_checks = {ex.notebook for ex in found}
    for path in sorted((ROOT / "notebooks").glob(NOTEBOOK_GLOB)):
        last = nbformat.read(path, as_version=4).cells[-1]
        if path.stem in with_checks:
            assert last.id == "still-open" and f"still_open({path.stem!r})" in last.source, path.name
    first = [ex for ex in found if ex.notebook == found[0].notebook]
    ledger_module.record_check(first[0].check, True)
    ledger_module.record_check(first[1].check, False)
    progress.still_open(found[0].notebook)
    out = capsys.readouterr().out
    assert f"还有 {len(first) - 1}/{len(first)} 个练习没通过" in out and first[0].check.split(".")[1] not in out
    assert f"{first[1].check.split('.')[1]}: 进行中(失败 1 次)" in out
    ledger_module.record_check(first[1].check, True)
    progress.still_open(found[0].notebook)
    assert f"本笔记本的 {len(first)} 个练习都通过了" in capsys.readouterr().out


def test_the_last_cell_of_a_notebook_imports_neither_nbformat_nor_torch():
    """``still_open`` ends every notebook and every graded kernel: importing ``course_tools.progress`` in a fresh
    interpreter must not pull in nbformat (about 0.9 s: jsonschema builds rfc3987_syntax's grammars) or torch."""
    code = ("import sys, course_tools.progress\n"
            "print(sorted(m for m in ('nbformat', 'jsonschema', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
