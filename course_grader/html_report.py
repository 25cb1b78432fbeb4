"""The class report as pages: ``grades.html`` beside ``grades.csv``, and an HTML feedback page per learner.

A learner's hint (:class:`Guide`) names the concept, never the answer. Pitfall: everything a learner controls is
untrusted: all text is escaped, file names come from ``feedback_names``, plots are ``data:`` images (drawn without
pyplot) and a Content-Security-Policy forbids scripts and any fetch. Discrimination: the point-biserial correlation
between passing a check and the learner's rest score (their other checks); near 0 it says nothing, negative: look
at the check; None when all or none passed or under 3 learners; in a small class it is noisy: the page shows the
count beside it.

Example::

    write_pages(Path("grades.csv"), grades, check_guide(released), similar_pairs(rows, sources))
    pass_rate_chart(check_rows(grades))   # 'data:image/png;base64,...'
"""
from __future__ import annotations

import base64
import importlib
import io
import math
import re
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from urllib.parse import quote

import nbformat
from matplotlib.figure import Figure

from course_grader.homework import NOTEBOOK as HOMEWORK
from course_grader.plan import cell_source, check_function, make_plan
from course_grader.report import (Grade, by_learner, counted, feedback_names, learner_scores, pass_rates, percent,
                                   read_rows)
from course_grader.similarity import OVERALL, SIMILARITY_COLUMNS, Block, SimilarityRow, matched_blocks, ranked
from course_grader.upgrades import upgrade_label

__all__ = ["REPRODUCE", "Guide", "check_guide", "SimilarPair", "similar_pairs", "CheckRow", "discrimination",
           "check_rows", "chart_label", "html_table", "write_pages"]

_HEAD = ("<!DOCTYPE html>\n<html lang=\"zh-CN\"><head><meta charset=\"utf-8\">"
         "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
         "style-src 'unsafe-inline'\"><title>{title}</title><style>body{{font-family:sans-serif;margin:2em}}"
         "table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:2px 6px;"
         "vertical-align:top}}pre{{margin:0;font-size:12px}}.fail{{color:#b00}}</style></head><body>\n")


REPRODUCE = "复现: "   # where a check message names its own reproduce command


def _first_tier(key: str) -> str:
    module, _, name = key.partition(".")
    try:
        hints = getattr(importlib.import_module(f"course_tools.checks.{module}"), "HINTS", {})
    except ImportError:
        return ""
    return next(iter(hints.get(name, ())), "")


@dataclass
class Guide:
    """(notebook, check label) -> hint tier 1, for the checks of the graded references."""

    hints: dict[tuple[str, str], str] = field(default_factory=dict)

    def hint(self, notebook: str, check: str) -> str:
        return self.hints.get((notebook, check), "")

    @staticmethod
    def reproduce(notebook: str, check: str, message: str) -> str:
        """How the learner sees the failure again: the message's own command, else the notebook's cells."""
        if REPRODUCE in message:
            return message.rpartition(REPRODUCE)[2].strip()
        return f"打开 notebooks/{notebook},从头运行到检查格子 {check}"


def check_guide(released: dict[str, nbformat.NotebookNode]) -> Guide:
    """The guide for the released references (as :func:`~course_grader.plan.references` returns them)."""
    from course_tools.checks.nb10_homework import HINTS, UPGRADES

    guide = Guide()
    for name, notebook in released.items():
        plan = make_plan(notebook, notebook)
        for index in plan.checks:
            key = check_function(cell_source(notebook.cells[index]))
            if key and (tier := _first_tier(key)):
                guide.hints[name, plan.label(index)] = tier
    for upgrade in UPGRADES:
        guide.hints[HOMEWORK, upgrade_label(upgrade)] = HINTS[upgrade.check.__name__][0]
    return guide


@dataclass(frozen=True)
class SimilarPair:
    """A flagged similarity row and, where both scripts were at hand, the runs of lines they share."""

    row: SimilarityRow
    blocks: list[Block] = field(default_factory=list)


def similar_pairs(rows: list[SimilarityRow], sources: dict[str, dict[str, str]],
                  baseline: dict[str, str]) -> list[SimilarPair]:
    """The flagged rows, highest first; ``sources``: learner or reference name -> script name -> source."""
    pairs = []
    for row in (r for r in ranked(rows) if r.flagged):
        a, b = sources.get(row.learner, {}).get(row.script), sources.get(row.other, {}).get(row.script)
        blocks = matched_blocks(a, b, baseline.get(row.script, "")) if a and b and row.script != OVERALL else []
        pairs.append(SimilarPair(row, blocks))
    return pairs


def read_similar_pairs(path: Path) -> list[SimilarPair]:
    """The flagged rows of a ``grades.similarity.csv`` (no sources kept there, so no side-by-side)."""
    return [SimilarPair(SimilarityRow(r["learner"], r["other"], r["script"], float(r["score"]), int(r["shared"]),
                                      int(r["prints"]), int(r["other_prints"]), r.get("note") or ""))
            for r in read_rows(path, SIMILARITY_COLUMNS[:-1]) if r["flagged"] == "1"]   # an older file: no note


_MIN_LEARNERS = 3


@dataclass(frozen=True)
class CheckRow:
    """One check of the class: how many passed it of how many graded, and its discrimination (or None)."""

    notebook: str
    check: str
    passed: int
    graded: int
    discrimination: float | None

    @property
    def rate(self) -> float:
        return self.passed / self.graded if self.graded else 0.0


def _correlation(xs: list[float], ys: list[float]) -> float | None:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def discrimination(grades: list[Grade]) -> dict[tuple[str, str], float | None]:
    """(notebook, check) -> the point-biserial correlation of passing it with the rest score (see above)."""
    totals = learner_scores(grades)
    pairs: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for g in grades:
        passed, total = totals[g.key[0]]
        for c in g.checks:
            if counted(c) and total > 1:
                xs, ys = pairs.setdefault((g.key[1], c.check), ([], []))
                xs.append(float(c.passed))
                ys.append((passed - c.passed) / (total - 1))
    return {key: _correlation(xs, ys) if len(xs) >= _MIN_LEARNERS else None for key, (xs, ys) in pairs.items()}


def check_rows(grades: list[Grade]) -> list[CheckRow]:
    """Every graded check with its pass rate and discrimination, hardest (lowest pass rate) first."""
    power = discrimination(grades)
    rows = [CheckRow(nb, check, p, n, power.get((nb, check))) for nb, check, p, n in pass_rates(grades) if n]
    return sorted(rows, key=lambda r: (r.rate, r.notebook, r.check))


def figure_uri(fig: Figure) -> str:
    """``fig`` as a PNG ``data:`` URI (the page embeds it; nothing is fetched)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def score_chart(grades: list[Grade]) -> str:
    """Box plot per notebook (and the homework) of the learners' scores, each learner a dot."""
    by_notebook: dict[str, list[float]] = {}
    for g in grades:
        if g.total:
            by_notebook.setdefault(g.key[1].removesuffix(".ipynb"), []).append(g.score * 100)
    names = sorted(by_notebook)
    fig = Figure(figsize=(7, 0.35 * len(names) + 1.2))
    ax = fig.subplots()
    if names:
        ax.boxplot([by_notebook[n] for n in names], orientation="horizontal", widths=0.5)
        for k, name in enumerate(names, start=1):
            ax.plot(by_notebook[name], [k] * len(by_notebook[name]), "o", alpha=0.4, color="tab:blue")
        ax.set_yticks(range(1, len(names) + 1), names)
    ax.set_xlim(-5, 105)
    ax.set_xlabel("score (%)")
    ax.invert_yaxis()
    return figure_uri(fig)


def chart_label(k: int, row: CheckRow) -> str:
    """``#3 01_amp check-amp-step``: the check named in ASCII (the plots have no CJK font), numbered as the table."""
    check = re.sub(r"^升级 (\d+).*", r"upgrade \1", row.check)
    check = re.sub(r"[^\x20-\x7e]+", " ", check).strip() or "check"
    return f"#{k} {row.notebook.removesuffix('.ipynb')} {check}"[:60]


def pass_rate_chart(rows: list[CheckRow]) -> str:
    """Horizontal bars: each check's class pass rate, hardest at the top, labelled as the page's table."""
    fig = Figure(figsize=(7, 0.3 * len(rows) + 1.2))
    ax = fig.subplots()
    labels = [chart_label(k, r) for k, r in enumerate(rows, start=1)]
    ax.barh(range(len(rows)), [r.rate * 100 for r in rows], color="tab:orange")
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.set_xlim(0, 100)
    ax.set_xlabel("pass rate (%)")
    ax.invert_yaxis()
    return figure_uri(fig)


def html_table(head: list[str], rows: list[list[str]], raw: frozenset[int] = frozenset()) -> str:
    """An HTML table; every cell escaped except the columns in ``raw`` (already HTML, built here)."""
    cells = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c if k in raw else escape(c)}</td>" for k, c in enumerate(r)) + "</tr>\n"
                   for r in rows)
    return f"<table><tr>{cells}</tr>\n{body}</table>\n"


def _checks_section(grades: list[Grade]) -> str:
    rows = check_rows(grades)
    table = html_table(["#", "notebook", "检查", "通过/批改", "通过率", "区分度"],
                   [[str(k), r.notebook, r.check, f"{r.passed}/{r.graded}", f"{r.rate:.0%}",
                     "-" if r.discrimination is None else f"{r.discrimination:+.2f}"]
                    for k, r in enumerate(rows, start=1)])
    return ("<h2 id=\"checks\">每个检查的班级通过率(最难的在前)</h2>\n"
            "<p>区分度:通过这个检查与学员其余检查得分率的相关系数(点二列相关);接近 +1 表示强的学员通过、弱的没通过,"
            "接近 0 表示通过与否看不出强弱,为负时请看看这个检查;全员通过、全员未通过或不足 3 人时记为 -。</p>\n"
            + (f"<img alt=\"每个检查的通过率\" src=\"{pass_rate_chart(rows)}\">\n" if rows else "") + table)


def _similar_section(pairs: list[SimilarPair]) -> str:
    out = [f"<h2 id=\"similarity\">相似度达到阈值的配对({len(pairs)} 行,只供人工查看)</h2>\n"]
    out.append(html_table(["学员", "对方", "脚本", "得分", "共享片段"],
                      [[p.row.learner, p.row.other, p.row.script, f"{p.row.score:.2f}",
                        f"{p.row.shared}/{min(p.row.prints, p.row.other_prints)}"] for p in pairs]))
    for p in pairs:
        if not p.blocks:
            continue
        out.append(f"<h3>{escape(p.row.learner)} ~ {escape(p.row.other)}: {escape(p.row.script)}</h3>\n")
        for block in p.blocks:
            left, right = ("\n".join(f"{n + k:4d}  {line}" for k, line in enumerate(lines)) for n, lines in
                           (block.left, block.right))
            out.append(f"<table><tr><td><pre>{escape(left)}</pre></td><td><pre>{escape(right)}</pre></td></tr>"
                       "</table>\n")
    return "".join(out)


def class_page(grades: list[Grade], pairs: list[SimilarPair], links: dict[str, str], sections: list[str] = ()) -> str:
    """``grades.html``: the whole class on one self-contained page; ``links``: learner -> feedback page href;
    ``sections``: the step modules' own HTML sections (already escaped), before the learners' table."""
    scores = learner_scores(grades)
    parts = [learner_scores(grades, lambda g: g.key[1] != HOMEWORK), learner_scores(grades, lambda g: g.key[1] == HOMEWORK)]
    learners = html_table(["学员", "总分", "得分率", "notebook", "作业", "反馈"],
                          [[escape(name), f"{p}/{t}", percent(p, t),
                            *(f"{s[name][0]}/{s[name][1]}" if s.get(name, (0, 0))[1] else "-" for s in parts),
                            f"<a href=\"{escape(links[name])}\">反馈</a>"]
                           for name, (p, t) in sorted(scores.items())], raw=frozenset({0, 5}))
    review = [[g.key[0], g.key[1], " | ".join(g.review)] for g in grades if g.review]
    discipline = [[g.key[0], g.commits] for g in grades if g.key[1] == HOMEWORK and g.commits]
    body = [_HEAD.format(title="班级批改报告"), "<h1>班级批改报告</h1>\n",
            f"<p>{len(scores)} 位学员,{len(grades)} 个 notebook 行。</p>\n",
            "<h2 id=\"scores\">得分分布(每个 notebook 和作业;每个点是一位学员)</h2>\n",
            f"<img alt=\"得分分布\" src=\"{score_chart(grades)}\">\n", _checks_section(grades),
            f"<h2 id=\"review\">需人工检查({len(review)} 行)</h2>\n", html_table(["学员", "notebook", "原因"], review),
            _similar_section(pairs),
            f"<h2 id=\"commits\">提交纪律({len(discipline)} 位学员)</h2>\n", html_table(["学员", "结论"], discipline),
            *sections, f"<h2 id=\"learners\">学员({len(scores)} 位)</h2>\n", learners, "</body></html>\n"]
    return "".join(body)


def _failed(g: Grade, guide: Guide) -> str:
    items = []
    for c in g.checks:
        if c.passed:
            continue
        hint = guide.hint(g.key[1], c.check)
        items.append(f"<li class=\"fail\">❌ {escape(c.check)}: {escape(c.message or '未通过')}"
                     + (f"<br>提示: {escape(hint)}" if hint else "")
                     + f"<br>复现: <code>{escape(guide.reproduce(g.key[1], c.check, c.message))}</code></li>\n")
    return "<ul>\n" + "".join(items) + "</ul>\n" if items else ""


def feedback_page(learner: str, grades: list[Grade], guide: Guide, back: str = "../grades.html") -> str:
    """One learner's page: the total, then per notebook the failed checks (message, hint tier 1, reproduce)."""
    passed, total = sum(g.passed for g in grades), sum(g.total for g in grades)
    out = [_HEAD.format(title=f"批改反馈: {escape(learner)}"), f"<h1>批改反馈: {escape(learner)}</h1>\n",
           f"<p>总分: {passed}/{total}({percent(passed, total)})· <a href=\"{escape(back)}\">班级报告</a></p>\n"]
    for g in sorted(grades, key=lambda g: g.notebook):
        out.append(f"<h2>{escape(g.key[1])}: {g.passed}/{g.total}</h2>\n")
        if g.commits:
            out.append(f"<p>提交纪律: {escape(g.commits)}</p>\n")
        out.append(_failed(g, guide))
        ok = [c.check for c in g.checks if c.passed]
        if ok:
            out.append(f"<p>✅ 通过: {escape(', '.join(ok))}</p>\n")
        if g.notes:
            out.append("<p>说明:</p><ul>" + "".join(f"<li>{escape(n)}</li>" for n in g.notes) + "</ul>\n")
    out.append("</body></html>\n")
    return "".join(out)


def write_pages(report: Path, grades: list[Grade], guide: Guide | None = None,
                pairs: list[SimilarPair] | None = None, sections: list[str] = ()) -> Path:
    """Write ``grades.html`` next to ``report`` and the learners' pages; the class page's path. ``pairs`` None:
    the flagged rows of ``<report>.similarity.csv`` where it exists (no side-by-side)."""
    report = Path(report)
    folder = report.with_name(report.stem + "_feedback")
    folder.mkdir(parents=True, exist_ok=True)
    guide = guide or Guide()
    if pairs is None:
        pairs = read_similar_pairs(report.with_name(report.stem + ".similarity.csv"))
    rows = by_learner(grades)
    page = report.with_suffix(".html")
    links = {}
    for learner, base in feedback_names(list(rows)).items():
        text = feedback_page(learner, rows[learner], guide, back=f"../{quote(page.name)}")
        (folder / f"{base}.html").write_text(text, encoding="utf-8")
        links[learner] = f"{quote(folder.name)}/{quote(base)}.html"
    page.write_text(class_page(grades, pairs, links, list(sections)), encoding="utf-8")
    return page
