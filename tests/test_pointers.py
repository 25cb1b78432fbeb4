"""Every section pointer a learner reads names a section that exists, and says truly what is there (issue 50).

How sections are numbered: a notebook ``solutions/NN_name.ipynb`` has section ``k`` for each markdown heading
``## k. ...`` and section ``k.m`` for each ``### k.m ...``; unnumbered headings (练习, 纪律) cannot be pointed
at. 09's experiments are its ``### 实验 k`` headings ("09 实验 7"). ``bench/RESULTS.md`` has section ``n`` for
each ``## n. ... (`bench/X.py`)`` heading.

A pointer is "NN §k", "NN §k–m", "NN §k.m", "``NN_name`` §k" (each followed by its list: "§k, §m", "§k 和 §m",
"§k (what) and §m"), "第 NN 章第 k 节", "NN 的第 k 节", "NN 实验 k", "RESULTS §n" or "RESULTS.md 第 n 节". A bare
"§k" or "第 k 节" points at the notebook it stands in, in a check module ``nbNN_*.py`` at notebook NN, elsewhere at
the notebook named last in its paragraph. It is read where a learner reads it: every cell of every solution
notebook, the source of ``course_utils``, ``course_tools``, ``course_grader`` and the homework scripts
(docstrings, check hints, the quiz bank, ``--help`` texts), README, GLOSSARY and RESULTS.

Also here: stored tables that list notebooks or exercise counts (00's dashboard, README's chapter map,
RESULTS' Run All and suite-time tables) agree with the notebooks, and every measured figure README quotes names
the machine and the date it came from.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import nbformat
import pytest

from tests.support.notebook_cells import SECTION

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"


# ------------------------------------------------------------------ what exists
@dataclass(frozen=True)
class Section:
    heading: str      # the markdown cell that holds the heading, and the headings of its subsections
    first_code: str   # the section's first code cell ("" if none)


def _notebooks() -> dict[str, Path]:
    """"08b" -> solutions/08b_flops_memory.ipynb, for every solution notebook (a new one joins by itself)."""
    return {p.name.split("_")[0]: p for p in sorted((ROOT / "solutions").glob("[0-9][0-9]*_*.ipynb"))}


@lru_cache(maxsize=None)
def sections(notebook: str) -> dict[str, Section]:
    """The numbered sections of one notebook: "k" for ``## k.``, "k.m" for ``### k.m``, "实验 k" for 09's."""
    cells = nbformat.read(_notebooks()[notebook], as_version=4).cells
    found: dict[str, Section] = {}
    for i, cell in enumerate(cells):
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            m = (SECTION.match(line) or re.match(r"###\s+(\d+\.\d+)\s", line)
                 or re.match(r"###\s+(实验\s*\d+)", line))
            if m:
                rest = cells[i + 1:]
                end = next((k for k, c in enumerate(rest) if c.cell_type == "markdown"
                            and re.search(r"^##? ", c.source, flags=re.MULTILINE)), len(rest))
                subheadings = [line for c in rest[:end] if c.cell_type == "markdown"
                               for line in c.source.splitlines() if line.startswith("#")]
                code = next((c.source for c in rest if c.cell_type == "code"), "")
                found[re.sub(r"\s+", " ", m.group(1))] = Section("\n".join([cell.source, *subheadings]), code)
    return found


@lru_cache(maxsize=None)
def results_sections() -> dict[str, str]:
    """RESULTS.md: section number -> its heading line."""
    return {m.group(1): m.group(0) for m in re.finditer(r"^## (\d+)\. .*$", RESULTS.read_text(encoding="utf-8"),
                                                         flags=re.MULTILINE)}


# ------------------------------------------------------------------ what a learner reads
@lru_cache(maxsize=None)
def texts() -> dict[str, tuple[str, str | None]]:
    """where -> (text, the notebook a bare "§k" in it means; "RESULTS" for RESULTS.md itself; None: none)."""
    found: dict[str, tuple[str, str | None]] = {}
    for notebook, path in _notebooks().items():
        for k, cell in enumerate(nbformat.read(path, as_version=4).cells):
            found[f"{path.name} cell {k}"] = (cell.source, notebook)
    for folder in ("course_utils", "course_tools", "course_grader", "solutions/homework"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            check = re.match(r"nb(\d\d[a-z]?)_", path.name) if path.parent.name == "checks" else None
            found[str(path.relative_to(ROOT))] = (path.read_text(encoding="utf-8"), check and check.group(1))
    for name in ("README.md", "GLOSSARY.md"):
        found[name] = ((ROOT / name).read_text(encoding="utf-8"), None)
    found["bench/RESULTS.md"] = (RESULTS.read_text(encoding="utf-8"), "RESULTS")
    return found


# ------------------------------------------------------------------ the pointers in a text
@dataclass(frozen=True)
class Pointer:
    where: str
    notebook: str        # "08b", or "RESULTS"
    section: str         # "4", "0.3", "实验 7"
    start: int           # offset in the text
    text: str            # the text it was found in

    def window(self, width: int = 160) -> str:
        return self.text[max(0, self.start - width):self.start + width]


_NB = r"(\d\d[a-z]?)"
_SEC = r"§\s*(\d+(?:\.\d+)?)(?:\s*[–-]\s*(\d+))?"
_QUALIFIED = re.compile(r"(?<![\w./§])`{0,2}" + _NB + r"(?:_[a-z0-9_]+)?(?:\.ipynb)?`{0,2}\s*" + _SEC)
_CHAPTER = re.compile(r"(?:第\s*" + _NB + r"\s*章|(?<![\w.])" + _NB + r"\s*的)第\s*(\d+)\s*节")
_EXPERIMENT = re.compile(r"(?<![\w.])" + _NB + r"\s*(实验)\s*(\d+)")
_RESULTS = re.compile(r"RESULTS(?:\.md)?`{0,2}\s*(?:" + _SEC + r"|第\s*(\d+)\s*节)")
_MORE = re.compile(r"\s*(?:\([^()]*\)\s*)?(?:[,、,;;]|and|和|与|或|及)\s*" + _SEC)
_BARE = re.compile(r"(?<![\w.])" + _SEC + r"|第\s*(\d+)\s*节")
_FOREIGN = re.compile(r"(?:PaLM|论文|paper)[^§\n]{0,12}§\s*[\d.]+")  # another document's sections


def _expand(a: str, b: str | None) -> list[str]:
    return [a] if not b else [str(k) for k in range(int(a), int(b) + 1)]


def _with_list(text: str, end: int) -> tuple[list[tuple[str, str | None]], int]:
    """The "§k, §m and §n" list that continues a pointer ending at ``end``."""
    more = []
    while m := _MORE.match(text, end):
        more.append((m.group(1), m.group(2)))
        end = m.end()
    return more, end


def pointers(where: str, text: str, own: str | None) -> list[Pointer]:
    found: list[Pointer] = []
    taken = [m.span() for m in _FOREIGN.finditer(text)]

    def add(notebook: str, secs: list[tuple[str, str | None]], start: int, end: int) -> None:
        taken.append((start, end))
        for a, b in secs:
            found.extend(Pointer(where, notebook, s, start, text) for s in _expand(a, b))

    for m in _RESULTS.finditer(text):
        more, end = _with_list(text, m.end())
        add("RESULTS", [(m.group(1) or m.group(3), m.group(2)), *more], m.start(), end)
    for m in _CHAPTER.finditer(text):
        add(m.group(1) or m.group(2), [(m.group(3), None)], m.start(), m.end())
    for m in _EXPERIMENT.finditer(text):
        found.append(Pointer(where, m.group(1), f"实验 {m.group(3)}", m.start(), text))
    for m in _QUALIFIED.finditer(text):
        if any(a <= m.start() < b for a, b in taken):
            continue
        more, end = _with_list(text, m.end())
        add(m.group(1), [(m.group(2), m.group(3)), *more], m.start(), end)
    for m in _BARE.finditer(text):
        if any(a <= m.start() < b for a, b in taken):
            continue
        target = own
        if target is None:  # a module: the notebook named last in this paragraph
            paragraph_start = text.rfind("\n\n", 0, m.start())
            named = [p.notebook for p in found if paragraph_start < p.start < m.start() and p.notebook != "RESULTS"]
            target = named[-1] if named else "?"
        found.extend(Pointer(where, target, s, m.start(), text) for s in _expand(m.group(1) or m.group(3), m.group(2)))
    return found


@lru_cache(maxsize=None)
def all_pointers() -> tuple[Pointer, ...]:
    return tuple(p for where, (text, own) in texts().items() for p in pointers(where, text, own))


def _line(p: Pointer) -> str:
    return f"{p.where}: {p.notebook} §{p.section} in …{p.window(50)!r}…"


# ------------------------------------------------------------------ pointers that say what is there
# A pointer that says what is there: (the phrase with the pointer in it, what the section's heading cell, its
# subsections' headings or its first code cell must contain). <NN> and <K> stand for the notebook and the section.
TOLD = [
    (r"datasheet's dense number, see <NN> §<K>", "datasheet"),          # train_cifar_pro.py --peak-flops
    (r"datasheet's dense number on a GPU; <NN> §<K> measures it", "matmul_peak_flops"),   # course_utils.monitor
    (r"<NN> §<K>[^。\n]{0,4}末尾的?[“\"]?标准排查顺序|标准排查顺序[^。\n]{0,12}<NN> §<K>", "排查顺序"),
    (r"<NN> §<K>「真正的 `GradScaler`」", "GradScaler"),
    (r"<NN> §<K> 的五要素|<NN> §<K> 列出并实现完整检查点的五要素", "五要素"),
    (r"<NN> §<K> 的失忆实验", "失忆"),
    (r"<NN> §<K> 的常见 bug 图鉴", "bug 图鉴"),
    (r"<NN> §<K> 的 `SpikeDetector`", "SpikeDetector"),
    (r"<NN> §<K> 在 `kill -9` 之后续训", "kill"),
]


def _told() -> list[tuple[str, str, str, str]]:
    """(where, notebook, section, needle) for each pointer of TOLD found in the texts."""
    found = []
    for said, needle in TOLD:
        pattern = re.compile(said.replace("<NN>", r"(\d\d[a-z]?)").replace("<K>", r"(\d+)"))
        for where, (text, _) in texts().items():
            found += [(where, m.group(1) or m.group(3), m.group(2) or m.group(4), needle) if m.lastindex > 2
                      else (where, m.group(1), m.group(2), needle) for m in pattern.finditer(text)]
    return found


def test_the_scan_finds_pointers_everywhere_a_learner_reads():
    found = all_pointers()
    kinds = Counter(p.where.split("/")[0].split(" ")[0] for p in found)
    assert len(found) > 150, len(found)
    assert kinds["course_utils"] and kinds["course_tools"] and kinds["README.md"] and kinds["solutions"]
    assert any(p.where.endswith("train_cifar_pro.py") and p.notebook == "08b" for p in found)   # --help texts
    assert any(p.where.startswith("course_tools/checks/nb09") for p in found)                   # the quiz bank
    assert any(p.notebook == "RESULTS" for p in found)
    assert set(sections("07")) >= {"0", "0.3", "2"} and "实验 7" in sections("09")


def test_every_pointer_names_a_section_that_exists():
    notebooks = _notebooks()
    wrong = []
    for p in all_pointers():
        if p.notebook == "RESULTS":
            ok = p.section in results_sections()
        else:
            ok = p.notebook in notebooks and p.section in sections(p.notebook)
        if not ok:
            wrong.append(_line(p))
    assert not wrong, "pointers to sections that do not exist:\n" + "\n".join(wrong)


def test_a_pointer_that_says_what_is_there_is_right():
    told = _told()
    assert len(told) >= 8 and {row[3] for row in told} >= {"datasheet", "排查顺序", "五要素"}, told
    wrong = []
    for where, notebook, section, needle in told:
        target = sections(notebook).get(section) if notebook in _notebooks() else None
        if target is None or needle.lower() not in (target.heading + target.first_code).lower():
            wrong.append(f"{where}: {notebook} §{section} should hold {needle!r}")
    assert not wrong, "\n".join(wrong)


def test_a_results_pointer_names_the_section_of_the_bench_cited_next_to_it():
    wrong = []
    for p in all_pointers():
        if p.notebook != "RESULTS" or p.section not in results_sections():
            continue
        if p.where == "bench/RESULTS.md":
            continue
        line_start = p.text.rfind("\n", 0, max(0, p.text.rfind("\n", 0, p.start)))  # this line and the one above
        near = p.text[max(line_start, p.start - 160):p.start + 80]
        near = re.split(r"\n\s*(?:- |\| )", near)[-1] if re.search(r"\n\s*(?:- |\| )", near[:160]) else near
        cited = set(re.findall(r"bench/(\w+)\.py", near))
        if cited and not any(f"bench/{c}.py" in results_sections()[p.section] for c in cited):
            wrong.append(f"{_line(p)}: cites {sorted(cited)}, the section is {results_sections()[p.section]!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("mistake, wanted", [
    ("see 08b §2", "08b §2"),                                  # --peak-flops: the datasheet table is §4
    ("(``bench/threads.py``, ``bench/RESULTS.md`` §8)", "RESULTS §8"),   # the threads bench is §9
])
def test_the_two_pointer_errors_of_issue_50_are_caught(mistake, wanted):
    """The two wrong pointers the audit found, put back into the text they stood in: the checks above fail."""
    if "08b" in mistake:
        text = f'help="on a GPU give the datasheet\'s dense number, {mistake}, or no mfu is logged"'
        found = pointers("train_cifar_pro.py", text, None)
        assert [(p.notebook, p.section) for p in found] == [("08b", "2")]
        target = sections("08b")["2"]
        assert "datasheet" not in target.heading.lower() and "datasheet" not in target.first_code.lower()
        assert "datasheet" in sections("08b")["4"].heading.lower()
    else:
        text = f"Measured on 2 cores ({mistake}): quiet, 2 threads took 0.54x the time of 1 thread"
        found = pointers("course_utils/env.py", text, None)
        assert [(p.notebook, p.section) for p in found] == [("RESULTS", "8")], found
        assert "bench/threads.py" not in results_sections()["8"] and "bench/threads.py" in results_sections()["9"]


# ------------------------------------------------------------------ stored tables that list notebooks
def _learner_exercises() -> Counter:
    from course_tools.checks.nb10_homework import UPGRADES
    from course_tools.progress import exercises

    counts = Counter(e.notebook for e in exercises())
    counts["10_homework"] += len(UPGRADES)
    return counts


def test_the_dashboard_stored_in_00_lists_every_notebook_with_its_exercise_count():
    cells = nbformat.read(ROOT / "solutions" / "00_start_here.ipynb", as_version=4).cells
    shown = [o["data"]["text/html"] for c in cells if c.cell_type == "code" and "show()" in c.source
             for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
    assert len(shown) == 1, "00 keeps one stored dashboard"
    rows = re.findall(r'<td><a href="([\w]+)\.ipynb">\1</a></td><td>(\d+)/(\d+)</td>', shown[0])
    stored = {name: int(total) for name, done, total in rows}
    assert all(done == "0" for _, done, _ in rows)
    assert stored == dict(_learner_exercises()), "00's stored dashboard is stale: run release --execute --only 00"


def _chapter_rows(text: str, pattern: str) -> list[str]:
    return re.findall(pattern, text, flags=re.MULTILINE)


def test_the_readme_chapter_map_lists_every_notebook():
    """README's map, one row per notebook in order (00's own map: tests/test_nb00_start_here.py)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    names = [p.stem for p in _notebooks().values()]
    assert _chapter_rows(readme, r"^\| `(\d\d[a-z]?_\w+)` \|") == names


def _results_block(name: str) -> str:
    text = RESULTS.read_text(encoding="utf-8")
    return text[text.index(f"<!-- results: {name} -->"):text.index("<!-- /results -->", text.index(f"<!-- results: {name} -->"))]


def test_the_run_all_table_in_results_matches_the_learner_notebooks():
    """RESULTS §13 (a learner's Run All, the "under a minute" table): one row per learner notebook, every code
    cell run, one calm note per exercise."""
    rows = re.findall(r"^\| (\d\d[a-z]?_\w+)\.ipynb\s*\|\s*[\d.]+\s*\|\s*(\d+)/(\d+)\s*\|\s*(\d+)\s*\|", _results_block("learner_run_all"),
                      flags=re.MULTILINE)
    learner = {p.stem: p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))}
    assert [r[0] for r in rows] == list(learner), "RESULTS §13 lists other notebooks: python bench/learner_run_all.py"
    exercises = _learner_exercises()
    for name, ran, cells, notes in rows:
        code = sum(c.cell_type == "code" for c in nbformat.read(learner[name], as_version=4).cells)
        assert (int(ran), int(cells), int(notes)) == (code, code, exercises[name]), \
            f"RESULTS §13, {name}: {ran}/{cells} cells, {notes} notes; the learner copy has {code} code cells, " \
            f"{exercises[name]} exercises (python bench/learner_run_all.py)"


def test_the_suite_time_table_names_existing_notebooks():
    named = re.findall(r"^\| (solutions/[\w.]+\.ipynb)", _results_block("suite_time"), flags=re.MULTILINE)
    assert named and all((ROOT / n).is_file() for n in named), named


# ------------------------------------------------------------------ README's measured figures
_FIGURE = re.compile(r"(?<![\w.§/-])\d[\d,.]*\s*(?:%|x\b|×|倍|s\b|ms\b|秒|毫秒|MB\b|GB\b|MiB\b|GiB\b)")
_MACHINE = re.compile(r"AMD EPYC|Intel Xeon|Intel\(R\) Xeon")
_DATE = re.compile(r"20\d\d-\d\d-\d\d|\b\d\d-\d\d\b")
_MEASURED = re.compile(r"实测|测得|量过|measured|took|用时")
# Figures that are not measurements: a budget or target ("≤ 480 s", "上限 3%"), a rule, a size or a setting.
_NOT_A_MEASUREMENT = re.compile(r"(?:≤|<=|上限|目标|预算|budget|target|under|不到|超过|以内|within|every|每)\s*"
                                r"\d[\d,.]*\s*(?:%|x\b|×|倍|s\b|ms\b|秒|分钟|MB\b|GB\b|MiB\b|GiB\b)")


def _readme_blocks() -> list[str]:
    """README's paragraphs, list items and table rows that report measurements: those of the two performance
    sections, and elsewhere those that say they measured (outside code blocks)."""
    text = re.sub(r"```.*?```", "", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.DOTALL)
    blocks = []
    for section in re.split(r"\n(?=## )", text):
        performance = section.startswith(("## 性能", "## Performance"))
        for paragraph in re.split(r"\n\s*\n", section):
            blocks += [b for b in re.split(r"\n(?=- |\| |\d+\. )", paragraph) if performance or _MEASURED.search(b)]
    return blocks


def test_every_measured_figure_in_the_readme_names_its_machine_and_date():
    blocks = _readme_blocks()
    assert len(blocks) > 20
    missing = []
    for block in blocks:
        figures = [m.group(0) for m in _FIGURE.finditer(_NOT_A_MEASUREMENT.sub("", block))]
        if figures and not (_MACHINE.search(block) and _DATE.search(block)):
            missing.append(f"{figures[:4]} in {block[:200]!r}")
    assert not missing, "measured figures without the machine and date they came from:\n" + "\n".join(missing)
