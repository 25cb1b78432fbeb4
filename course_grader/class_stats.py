"""The class report's numbers and plots: score distributions, pass rates, each check's discrimination.

Discrimination: the point-biserial correlation between passing a check and the learner's rest score (their
other checks); near 0 it says nothing, negative: look at the check; None when all or none passed or under 3
learners. Pitfall: in a small class it is noisy: the page shows the count beside it. Plots avoid pyplot.

Example::

    pass_rate_chart(check_rows(grades))   # 'data:image/png;base64,...'
"""
from __future__ import annotations

import base64
import io
import math
import re
from dataclasses import dataclass

from matplotlib.figure import Figure

from course_grader.report import Grade, counted, learner_scores, pass_rates

__all__ = ["CheckRow", "discrimination", "check_rows", "figure_uri", "score_chart",
           "chart_label", "pass_rate_chart"]

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
    """``#3 01_amp check-amp-step``, ``#1 10_homework upgrade 2``: the check named in ASCII (the plots have no CJK
    font), numbered as the page's table."""
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
