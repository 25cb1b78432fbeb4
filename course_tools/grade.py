"""Grade learners' notebooks against the reference in ``solutions/`` (instructor tool).

For each submitted ``NN_*.ipynb`` the grader builds a fresh notebook from the
reference: every cell comes from ``solutions/NN_*.ipynb`` (as released: solutions
stripped, ``solution-only`` cells dropped, outputs cleared), except the source of the
``exercise`` cells, which comes from the learner. Editing or deleting a ``check``
cell therefore changes nothing. The notebook is run with pytest + nbval
(``--nbval-lax``) in a subprocess, in a scratch folder, with a per-cell and a total
time limit. A tiny pytest plugin written next to it records, for every cell, its
tags and outcome.

    score = check cells passed / check cells present

    python -m course_tools.grade submissions/*/ --report grades.csv
    python -m course_tools.grade alice/ bob/09_self_test.ipynb --cell-timeout 120 --timeout 900

A submission is a learner's notebook, a folder of notebooks (one folder per learner;
learner = folder name), or a folder of such folders. Exercise cells are matched by
cell id, then by order. A notebook that loops, kills its kernel, raises everywhere,
is not valid JSON or comes from an older version is graded (zero or partial) with a
note; it never stops the other submissions.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course_tools.quiet import quiet_environ
from course_tools.release import learner_notebook
from course_utils.monitor import read_metrics

__all__ = ["ROOT", "NOTEBOOK_RE", "COLUMNS", "PLUGIN", "Grade", "collect", "find_reference", "merge",
           "run_notebook", "grade_notebook", "grade_all", "table", "write_csv", "main"]


ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_RE = re.compile(r"^(\d\d)_.*\.ipynb$")
COLUMNS = ("learner", "notebook", "passed", "total", "score", "notes")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# Written into the scratch folder; loaded with ``-p _grade_plugin``. One JSON line per
# nbval cell item (appended and flushed at once, so a killed run keeps what it had).
PLUGIN = r'''
import json, os, re
import pytest

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_OUT = os.environ["GRADE_RESULTS"]


def _message(excinfo):
    if excinfo is None:
        return ""
    exc = excinfo.value
    if str(exc).startswith("Timeout"):
        return str(exc)
    text = getattr(exc, "inner_traceback", None) or ""
    lines = [l.strip() for l in _ANSI.sub("", text).splitlines() if l.strip()]
    if lines:
        return lines[-1]
    return f"{type(exc).__name__}: {exc}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    cell = getattr(item, "cell", None)
    if cell is None:
        return
    failed_setup = report.when == "setup" and not report.passed
    if report.when != "call" and not failed_setup:
        return
    if hasattr(report, "wasxfail"):
        state = "not-run"
    elif report.skipped:
        state = "skipped"
    else:
        state = report.outcome
    record = {
        "index": getattr(item, "cell_num", None),
        "id": cell.get("id"),
        "tags": list(cell.get("metadata", {}).get("tags", [])),
        "outcome": state,
        "message": _message(call.excinfo)[:500] if state == "failed" else "",
    }
    with open(_OUT, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
'''


@dataclass
class Grade:
    learner: str
    notebook: str
    passed: int = 0
    total: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def row(self) -> dict[str, object]:
        return {"learner": self.learner, "notebook": self.notebook, "passed": self.passed,
                "total": self.total, "score": f"{self.score:.3f}", "notes": " | ".join(self.notes)}


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _is(cell, tag: str) -> bool:
    return cell.get("cell_type") == "code" and tag in _tags(cell)


# ---------------------------------------------------------------- collecting

def collect(paths: list[Path]) -> list[tuple[str, Path]]:
    """``(learner, notebook path)`` pairs. A loose file's learner is its file name."""
    found: list[tuple[str, Path]] = []
    for path in paths:
        path = Path(path)
        if path.is_file():
            found.append((path.name, path))
        elif path.is_dir():
            notebooks = sorted(p for p in path.glob("*.ipynb") if NOTEBOOK_RE.match(p.name))
            if notebooks:
                found += [(path.name, nb) for nb in notebooks]
            else:  # a folder of learner folders
                for sub in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
                    found += [(sub.name, nb) for nb in sorted(sub.glob("*.ipynb")) if NOTEBOOK_RE.match(nb.name)]
        else:
            found.append((path.name, path))  # reported as missing
    return found


def find_reference(notebook: Path, solutions: Path) -> Path | None:
    """The reference with the same name, else the one with the same ``NN_`` prefix."""
    exact = solutions / notebook.name
    if exact.exists():
        return exact
    match = re.match(r"^(\d\d)_", notebook.name)
    if match:
        same = sorted(solutions.glob(f"{match.group(1)}_*.ipynb"))
        if len(same) == 1:
            return same[0]
    return None


# ---------------------------------------------------------------- merging

def merge(reference: nbformat.NotebookNode, submission: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, list[str]]:
    """The released reference with the learner's exercise sources put in. Returns (notebook, notes)."""
    graded = learner_notebook(reference)
    ref_ex = [c for c in graded.cells if _is(c, "exercise")]
    sub_code = [c for c in submission.get("cells", []) if c.get("cell_type") == "code"]
    by_id = {c.get("id"): c for c in sub_code if c.get("id")}
    sub_ex = [c for c in sub_code if _is(c, "exercise")]
    used: set[int] = set()
    slots: list = [None] * len(ref_ex)
    for k, cell in enumerate(ref_ex):  # by cell id first
        hit = by_id.get(cell.get("id"))
        if hit is not None:
            slots[k] = hit
            used.add(id(hit))
    remaining = [c for c in sub_ex if id(c) not in used]
    by_order = 0
    for k in range(len(ref_ex)):  # then the unmatched ones in order
        if slots[k] is None and remaining:
            slots[k] = remaining.pop(0)
            by_order += 1
    notes = []
    missing = [k + 1 for k, s in enumerate(slots) if s is None]
    for cell, hit in zip(ref_ex, slots):
        if hit is not None:
            source = hit.get("source", "")
            cell.source = "".join(source) if isinstance(source, list) else str(source)
    if by_order or missing or len(sub_ex) != len(ref_ex):
        notes.append(f"练习格子与参考不一致(旧版本?): 参考 {len(ref_ex)} 个,提交 {len(sub_ex)} 个;"
                     f"按 id 匹配 {len(ref_ex) - by_order - len(missing)} 个,按顺序匹配 {by_order} 个"
                     + (f",未找到练习 {missing}(按未完成计分)" if missing else ""))
    return graded, notes


# ---------------------------------------------------------------- running

def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_notebook(nb: nbformat.NotebookNode, workdir: Path, name: str, cell_timeout: int,
                 total_timeout: int, solutions: Path, threads: int = 0) -> tuple[list[dict], str]:
    """Run ``nb`` under pytest + nbval in ``workdir``; returns (per-cell records, problem or '')."""
    workdir.mkdir(parents=True, exist_ok=True)
    for extra in solutions.iterdir():  # helper folders next to the notebooks (homework/ ...)
        if extra.is_dir() and not extra.name.startswith(".") and not (workdir / extra.name).exists():
            try:
                (workdir / extra.name).symlink_to(extra.resolve(), target_is_directory=True)
            except OSError:
                pass
    path = workdir / name
    nbformat.write(nb, path)
    (workdir / "_grade_plugin.py").write_text(PLUGIN, encoding="utf-8")
    (workdir / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    results = workdir / "_grade_results.jsonl"
    results.unlink(missing_ok=True)
    env = dict(quiet_environ(override=True), GRADE_RESULTS=str(results),
               MPLBACKEND="module://matplotlib_inline.backend_inline",
               PYTHONPATH=os.pathsep.join([str(workdir)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.pop("PYTEST_ADDOPTS", None)
    if threads:
        env.setdefault("OMP_NUM_THREADS", str(threads))
    cmd = [sys.executable, "-m", "pytest", "-c", str(workdir / "pytest.ini"), "--rootdir", str(workdir),
           "-p", "no:cacheprovider", "-p", "_grade_plugin", "--nbval-lax", "--nbval-current-env",
           f"--nbval-cell-timeout={cell_timeout}", "-q", name]
    problem = ""
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=total_timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        problem = f"超过总时限 {total_timeout} s,已终止"
    finally:
        _kill_group(proc)  # a kernel left behind by pytest
    records = read_metrics(results)  # the JSONL reader of course_utils.monitor: a torn last line is skipped
    if not records and not problem:
        tail = _ANSI.sub("", (out or b"").decode("utf-8", "replace")).strip().splitlines()[-3:]
        problem = "pytest 没有运行任何格子: " + " / ".join(tail)
    return records, problem


def grade_notebook(learner: str, path: Path, solutions: Path, scratch: Path,
                   cell_timeout: int = 60, total_timeout: int = 600, threads: int = 0) -> Grade:
    """Grade one submitted notebook; never raises for a bad submission."""
    grade = Grade(learner, path.name)
    reference_path = find_reference(path, solutions)
    if reference_path is None:
        grade.notes.append(f"在 {solutions} 中找不到对应的参考 notebook")
        return grade
    grade.notebook = reference_path.name
    reference = nbformat.read(reference_path, as_version=4)
    checks = [c for c in learner_notebook(reference).cells if _is(c, "check")]
    grade.total = len(checks)
    if not checks:
        grade.notes.append("参考 notebook 没有 check 格子,不计分(未运行)")
        return grade
    if not path.exists():
        grade.notes.append("文件不存在")
        return grade
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        submission = nbformat.from_dict(raw)
        if not isinstance(submission.get("cells"), list):
            raise ValueError("没有 cells 列表")
    except (ValueError, UnicodeDecodeError, TypeError, AttributeError) as exc:
        grade.notes.append(f"无法读取(不是有效的 notebook JSON): {str(exc)[:120]}")
        return grade
    graded, notes = merge(reference, submission)
    grade.notes += notes
    records, problem = run_notebook(graded, scratch, reference_path.name, cell_timeout, total_timeout, solutions,
                                   threads)
    if problem:
        grade.notes.append(problem)
    check_records = [r for r in records if "check" in r.get("tags", [])]
    seen = {r.get("index") for r in check_records}
    grade.passed = sum(r["outcome"] == "passed" for r in check_records)
    for k, rec in enumerate(check_records):
        if rec["outcome"] == "failed" and "Kernel dead" in (rec.get("message") or ""):
            grade.notes.append(f"check {rec.get('index')}: 未运行(内核已退出,提交的代码是否结束了进程?)")
        elif rec["outcome"] == "failed":
            grade.notes.append(f"check {rec.get('index')}: {rec.get('message') or '失败'}")
        elif rec["outcome"] != "passed":
            grade.notes.append(f"check {rec.get('index')}: 未运行(前面的格子超时或内核已退出)")
    if len(seen) < grade.total:
        grade.notes.append(f"{grade.total - len(seen)} 个 check 没有运行结果(内核退出或被终止)")
    timed_out = [r for r in records if "Timeout" in (r.get("message") or "")]
    if timed_out:
        grade.notes.append(f"格子 {timed_out[0].get('index')} 超过单格时限 {cell_timeout} s")
    return grade


def grade_all(submissions: list[Path], solutions: Path = ROOT / "solutions", cell_timeout: int = 60,
              total_timeout: int = 600, jobs: int = 1, verbose: bool = True) -> list[Grade]:
    """Grade every notebook of every submission, one subprocess each (``jobs`` at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    pairs = collect(submissions)
    # parallel kernels on a few cores: one torch thread each, unless OMP_NUM_THREADS is set
    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else 0
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        def one(n: int) -> Grade:
            learner, path = pairs[n]
            start = time.perf_counter()
            scratch = Path(tmp) / f"{n:03d}"
            try:
                grade = grade_notebook(learner, path, Path(solutions), scratch, cell_timeout, total_timeout, threads)
            except Exception as exc:  # a grader bug must not stop the others
                grade = Grade(learner, path.name, notes=[f"评分出错: {type(exc).__name__}: {exc}"])
            shutil.rmtree(scratch, ignore_errors=True)
            if verbose:
                print(f"  {learner} / {grade.notebook}: {grade.passed}/{grade.total} "
                      f"({time.perf_counter() - start:.0f} s)", flush=True)
            return grade

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            return list(pool.map(one, range(len(pairs))))


def table(grades: list[Grade]) -> str:
    """The grades as an aligned text table, plus one total line per learner."""
    rows = [("learner", "notebook", "passed", "total", "score")]
    rows += [(g.learner, g.notebook, str(g.passed), str(g.total), f"{g.score:.0%}" if g.total else "-")
             for g in grades]
    learners: dict[str, list[int]] = {}
    for g in grades:
        acc = learners.setdefault(g.learner, [0, 0])
        acc[0] += g.passed
        acc[1] += g.total
    rows += [(name, "(all)", str(p), str(t), f"{p / t:.0%}" if t else "-") for name, (p, t) in learners.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    notes = [f"- {g.learner} / {g.notebook}: {'; '.join(g.notes)}" for g in grades if g.notes]
    return "\n".join(lines + (["", "notes:"] + notes if notes else []))


def write_csv(grades: list[Grade], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for g in grades:
            writer.writerow(g.row())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("submissions", nargs="+", type=Path, help="notebooks, learner folders, or a folder of learner folders")
    p.add_argument("--report", type=Path, default=None, help="CSV to write (learner,notebook,passed,total,score,notes)")
    p.add_argument("--solutions", type=Path, default=ROOT / "solutions", help="reference notebooks (default: solutions/)")
    p.add_argument("--cell-timeout", type=int, default=120, help="seconds per cell (default 120)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per notebook in total (default 900)")
    p.add_argument("--jobs", type=int, default=1, help="notebooks graded at the same time (default 1)")
    args = p.parse_args(argv)
    grades = grade_all(args.submissions, args.solutions, args.cell_timeout, args.timeout, args.jobs)
    print(table(grades))
    if args.report:
        write_csv(grades, args.report)
        print(f"wrote {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
