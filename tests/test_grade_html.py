"""The class report's pages (grades.html, the HTML feedback), built from Grade rows directly: no grading run.

A hostile class: a learner folder named like a script tag, one with ``../`` in it, a check message
that closes the table; the pages must escape all of it, name files safely and fetch nothing.
"""
from __future__ import annotations

import html.parser
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

from course_tools.checks import nb01_amp
from course_grader.html_report import (Guide, chart_label, check_guide, check_rows, discrimination, similar_pairs,
                                       write_pages)
from course_grader.plan import make_plan, references
from course_grader.report import CheckOutcome, Grade
from course_grader.similarity import OVERALL, SimilarityRow, matched_blocks

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "<script>alert(1)</script>"
TRAVERSAL = "../../escape"
NB = "01_fixture.ipynb"
HW = "10_homework.ipynb"
COPY_A = "def train(model, data):\n    for x, y in data:\n        loss = model(x).sum() * 2\n" \
         "        loss.backward()\n        opt.step()\n    return loss\n"
COPY_B = "def fit(net, batches):\n    for a, b in batches:\n        l = net(a).sum() * 3   # renamed\n" \
         "        l.backward()\n        opt.step()\n    return l\n"


def _class() -> list[Grade]:
    """Four learners, two checks: 'hard' is passed by the strong ones only, 'easy' by everyone."""
    def row(name, hard, notes=(), review=()):
        return Grade(name, NB, 1 + hard, 2, list(notes), list(review),
                     [CheckOutcome("easy", True), CheckOutcome("hard", bool(hard), "" if hard else "期望 3</table>")])

    hw = Grade(SCRIPT, HW, 0, 1, [], [], [CheckOutcome("升级 1: x", False, "没训练。复现: python train_cifar.py --seed 1")],
               commits="不合格: 升级 2+3 在同一提交")
    return [row(SCRIPT, 0, review=["练习 1 第 2 行: sys.modules"]), row(TRAVERSAL, 0), row("ann", 1), row("ben", 1), hw]


class _Page(html.parser.HTMLParser):
    """Tables (rows of cell texts), links, image sources and script elements of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.links: list[str] = []
        self.images: list[str] = []
        self.scripts = 0
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "a":
            self.links.append(attrs["href"])
        elif tag == "img":
            self.images.append(attrs["src"])
        elif tag == "script":
            self.scripts += 1

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


def _learner_table(page: _Page) -> list[list[str]]:
    return next(t for t in page.tables if t and t[0][:2] == ["学员", "总分"])


def _assert_safe_and_complete(page: _Page, folder: Path) -> None:
    assert page.scripts == 0
    rows = _learner_table(page)
    assert sorted(r[0] for r in rows[1:]) == sorted(["ann", "ben", SCRIPT, TRAVERSAL])   # one row per learner
    assert len(page.images) == 2 and all(src.startswith("data:image/png;base64,") for src in page.images)
    for link in page.links:                               # every link is a page of ours, inside the report folder
        assert "://" not in link and not link.startswith("/")
        target = (folder / unquote(link)).resolve()
        assert target.is_file() and folder.resolve() in target.parents, link


def _write(tmp_path: Path, guide: Guide | None = None) -> Path:
    sources = {"ann": {"train.py": COPY_A}, "ben": {"train.py": COPY_B}}
    rows = [SimilarityRow("ann", "ben", "train.py", 0.9, 30, 33, 31), SimilarityRow("ann", "ben", OVERALL, 0.9, 30, 33, 31),
            SimilarityRow("ann", TRAVERSAL, "train.py", 0.1, 1, 30, 30)]
    return write_pages(tmp_path / "grades.csv", _class(), guide, similar_pairs(rows, sources, {}))


def test_pages_escape_learner_text_link_their_files_and_fetch_nothing(tmp_path):
    page_path = _write(tmp_path, Guide({(NB, "hard"): "提示一级: 想想 hard 的定义"}))
    text = page_path.read_text(encoding="utf-8")
    assert SCRIPT not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "http://" not in text and "https://" not in text and "default-src 'none'" in text
    page = _parse(text)
    _assert_safe_and_complete(page, tmp_path)
    similar = next(t for t in page.tables if t and t[0][:2] == ["学员", "对方"])
    assert sorted(r[:3] for r in similar[1:]) == [["ann", "ben", OVERALL], ["ann", "ben", "train.py"]]   # flagged only
    side = next(t for t in page.tables if len(t) == 1 and len(t[0]) == 2 and "backward" in t[0][0])
    assert "loss.backward()" in side[0][0] and "l.backward()" in side[0][1]
    assert ["不合格: 升级 2+3 在同一提交"] == [r[1] for t in page.tables if t and t[0] == ["学员", "结论"] for r in t[1:]]
    files = sorted(p.name for p in (tmp_path / "grades_feedback").iterdir())
    assert len(files) == 4 and all("/" not in f and not f.startswith(".") for f in files)
    assert not (tmp_path.parent / "escape.html").exists()
    mine = next(p for p in (tmp_path / "grades_feedback").iterdir() if "script" in p.name).read_text(encoding="utf-8")
    assert SCRIPT not in mine and "</table>" not in mine and "期望 3&lt;/table&gt;" in mine
    assert "提示: 提示一级: 想想 hard 的定义" in mine
    assert "复现: <code>python train_cifar.py --seed 1</code>" in mine
    assert f"复现: <code>打开 notebooks/{NB},从头运行到检查格子 hard</code>" in mine
    assert _parse(mine).scripts == 0 and _parse(mine).links == ["../grades.html"]


@pytest.mark.slow  # starts a headless Chromium
def test_the_class_page_renders_in_headless_chromium(tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    page_path = _write(tmp_path)
    out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page_path.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-500:]
    page = _parse(out.stdout)
    _assert_safe_and_complete(page, tmp_path)
    assert SCRIPT in out.stdout.replace("&lt;", "<").replace("&gt;", ">")   # shown as text, run as nothing


def test_discrimination_separates_strong_from_weak_and_is_undefined_when_all_pass():
    power = discrimination(_class())
    assert power[NB, "hard"] > 0.5 and power[NB, "easy"] is None and power[HW, "升级 1: x"] is None  # 1 learner
    flipped = _class()
    for g in flipped:   # 'easy' now passed by exactly those who fail 'hard' (the weak): negative
        hard = {c.check: c.passed for c in g.checks}.get("hard")
        g.checks = [CheckOutcome(c.check, not hard if c.check == "easy" else c.passed, c.message) for c in g.checks]
        g.passed = sum(c.passed for c in g.checks)
    assert discrimination(flipped)[NB, "easy"] < -0.5
    rows = check_rows(_class())
    assert [r.check for r in rows] == ["升级 1: x", "hard", "easy"]   # hardest first
    missing = _class() + [Grade("cat", NB, 0, 2, checks=[CheckOutcome("easy", False, "未提交"),
                                                          CheckOutcome("hard", False, "未提交")])]
    assert [r.graded for r in check_rows(missing)] == [1, 4, 4]        # a notebook not handed in is not counted


def test_side_by_side_lines_up_a_renamed_copy_and_skips_the_baseline():
    blocks = matched_blocks(COPY_A, COPY_B)
    assert len(blocks) == 1 and blocks[0].left[0] == 1 and len(blocks[0].left[1]) == 6
    assert matched_blocks(COPY_A, COPY_B, baseline=COPY_A) == []
    assert matched_blocks(COPY_A, "print('unrelated')\n" * 5) == []


def test_guide_gives_hint_tier_one_of_the_check_a_cell_calls():
    _, released = references(ROOT / "solutions")
    guide = check_guide(released)
    plan = make_plan(released["01_amp.ipynb"], released["01_amp.ipynb"])
    labels = [plan.label(i) for i in plan.checks]
    tiers = {t[0] for t in nb01_amp.HINTS.values()}
    shown = [guide.hint("01_amp.ipynb", label) for label in labels]
    assert shown and all(h in tiers for h in shown if h) and set(shown) - {""} == tiers
    assert guide.hint("01_amp.ipynb", "no-such-check") == ""


def test_the_learner_table_shows_each_part_beside_the_total_and_the_chart_names_the_check(tmp_path):
    homework_only = Grade("hw_only", HW, 5, 5, checks=[CheckOutcome(f"升级 {k}: t", True) for k in range(1, 6)])
    page = _parse(write_pages(tmp_path / "grades.csv", [*_class(), homework_only]).read_text(encoding="utf-8"))
    rows = {r[0]: r for r in _learner_table(page)}
    assert rows["学员"][:5] == ["学员", "总分", "得分率", "notebook", "作业"]
    assert rows["hw_only"][1:5] == ["5/5", "100%", "-", "5/5"]          # not 5/25: no notebook was graded
    assert rows["ann"][3:5] == ["2/2", "-"] and rows[SCRIPT][1:5] == ["1/3", "33%", "1/2", "0/1"]
    labels = [chart_label(k, r) for k, r in enumerate(check_rows([*_class(), homework_only]), start=1)]
    assert "#1 10_homework upgrade 1" in labels and any(label.endswith(f"{NB.removesuffix('.ipynb')} hard")
                                                        for label in labels), labels
