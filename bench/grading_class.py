"""A homework class with histories, graded learner by learner: minutes per learner and the verdicts.

The class (``make_class``): learners who hand in a git bundle of the branch ``homework-0.4``, made
the way 10_homework says (the released baseline committed, then one commit per upgrade with the
reference answer's patches), and realistic variants of it: upgrades 1 and 2 squashed into one
commit, only upgrades 1-3 done, every commit also carrying the workbook's notebooks plus a commit
that touches notebooks only, and a plain ``homework/`` folder without history. Each learner is graded
in the sandbox with ``grade_homework`` (``--jobs 1``: one learner at a time, as ``bench/grading.py``
does; ``--jobs 2`` two learners at a time). Printed and returned: wall seconds per learner, check runs per learner, and each row's verdicts
(score, commit discipline, each upgrade's outcome), which ``--verdicts FILE`` compares with an
earlier run so a faster grader is shown to decide the same.

    python bench/grading.py --class-learners 10      # the class run, beside the other arms
    python bench/grading_class.py --learners 5       # on its own
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO  # noqa: E402

MAX_PER_LEARNER_S = 120.0   # the target of issue 36 on a quiet 2-core machine
VARIANTS = ("squashed", "partial", "notebooks", "folder")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=learner", "-c", "user.email=l@example.com", "-c", "commit.gpgsign=false",
                    *args], cwd=repo, check=True, capture_output=True)


def _learner(root: Path, name: str, variant: str) -> Path:
    """One learner folder of ``variant`` ("reference" or one of ``VARIANTS``)."""
    from course_tools.checks.nb10_homework import UPGRADES

    folder = root / "class" / name
    repo = root / "repos" / name
    homework = repo / "notebooks" / "homework"
    homework.mkdir(parents=True)
    for script in (REPO / "notebooks" / "homework").iterdir():
        if script.is_file():
            (homework / script.name).write_bytes(script.read_bytes())
    notebook = repo / "notebooks" / "01_amp.ipynb"
    notebook.write_bytes((REPO / "notebooks" / "01_amp.ipynb").read_bytes())
    _git(repo, "init", "-q", "-b", "homework-0.4")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "baseline")
    last = 3 if variant == "partial" else len(UPGRADES)
    for k in range(1, last + 1):
        _git(repo, "apply", str(REPO / "solutions" / "homework" / UPGRADES[k - 1].patch))
        if variant == "notebooks":   # the learner's saved outputs travel with every commit
            notebook.write_text(notebook.read_text(encoding="utf-8") + " " * k, encoding="utf-8")
        if variant == "squashed" and k == 1:
            continue
        _git(repo, "add", ".")
        _git(repo, "commit", "-q", "-m", f"upgrade {k}")
        if variant == "notebooks" and k == 2:
            notebook.write_text(notebook.read_text(encoding="utf-8") + "\n", encoding="utf-8")
            _git(repo, "commit", "-q", "-am", "notebooks only")
    folder.mkdir(parents=True)
    if variant == "folder":
        (folder / "homework").mkdir()
        for script in homework.iterdir():
            (folder / "homework" / script.name).write_bytes(script.read_bytes())
    else:
        _git(repo, "bundle", "create", str(folder / "hw.bundle"), "homework-0.4")
    return folder


def make_class(root: Path, learners: int) -> list[str]:
    """``learners`` learner folders under ``root / "class"`` (their repositories beside it): the variants
    first, the rest reference histories."""
    kinds = [*VARIANTS, *["reference"] * max(0, learners - len(VARIANTS))][:learners]
    names = []
    for n, variant in enumerate(kinds):
        names.append(f"{n:02d}-{variant}")
        _learner(root, names[-1], variant)
    return names


def _grade_one(item, setup, private: Path) -> dict:
    from course_grader.homework import grade_homework

    start = time.perf_counter()
    result = grade_homework(item, setup, sandbox=True, private=private)
    grade = result.grade
    return {"learner": item.learner, "seconds": round(time.perf_counter() - start, 1), "runs": result.runs,
            "verdicts": {"passed": grade.passed, "commits": grade.commits,
                         "checks": [[c.check, c.passed] for c in grade.checks]}}


def grade_class(learners: int, jobs: int = 1, log=print) -> dict:
    """Build the class in a scratch folder and grade it in the sandbox, ``jobs`` learners at a time (as the
    grader's ``--jobs``); wall seconds per learner, check runs and verdicts."""
    from concurrent.futures import ThreadPoolExecutor

    from course_grader.collect import collect
    from course_grader.homework import NOTEBOOK, HomeworkSetup

    setup = HomeworkSetup.for_solutions(REPO / "solutions")
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="grading-class") as tmp:
        root = Path(tmp)
        make_class(root, learners)
        items = sorted(collect([root / "class"], [], set(), NOTEBOOK)[0], key=lambda item: item.learner)
        for item in items:
            (root / f"private-{item.learner}").mkdir()
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            rows = list(pool.map(lambda item: _grade_one(item, setup, root / f"private-{item.learner}"), items))
        wall = time.perf_counter() - start
    for row in rows:
        log(f"  {row['learner']}: {row['seconds']:.0f} s, {row['runs']} check runs, {row['verdicts']['passed']}/5, "
            f"{row['verdicts']['commits']}")
    per = wall / len(rows)
    return {"jobs": jobs, "learners": rows, "wall_s": round(wall, 1), "seconds_per_learner": round(per, 1),
            "max_seconds": MAX_PER_LEARNER_S, "load_avg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)],
            "passed": per <= MAX_PER_LEARNER_S}


def same_verdicts(result: dict, earlier: dict) -> list[str]:
    """The learners whose verdicts differ from ``earlier``'s (a run of the same class)."""
    before = {r["learner"]: r["verdicts"] for r in earlier["learners"]}
    return [r["learner"] for r in result["learners"] if r["learner"] in before and before[r["learner"]] != r["verdicts"]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--learners", type=int, default=10)
    p.add_argument("--jobs", type=int, default=1, help="learners graded at the same time (the grader's --jobs)")
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    p.add_argument("--verdicts", type=Path, help="a JSON of an earlier run: its verdicts must be the same")
    args = p.parse_args(argv)
    result = grade_class(args.learners, args.jobs)
    if args.out:
        args.out.write_text(json.dumps(result, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"--jobs {args.jobs}: {result['wall_s']:.0f} s for {args.learners} learners, "
          f"{result['seconds_per_learner']:.0f} s per learner (limit {MAX_PER_LEARNER_S:.0f} s)")
    if args.verdicts:
        changed = same_verdicts(result, json.loads(args.verdicts.read_text(encoding="utf-8")))
        print("verdicts: the same as " + str(args.verdicts) if not changed else f"verdicts CHANGED for {changed}")
        if changed:
            return 1
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
