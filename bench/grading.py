"""Cost of the grading sandbox: the same merged notebooks graded with and without bubblewrap.

Every learner submits the reference solution (so every cell runs and every check passes) of
notebooks 01-03. The class is graded in rounds of ``--jobs`` notebooks: in each round the same
notebooks are graded once in the sandbox and once without it, each arm with ``--jobs`` kernels at
a time, same ``COURSE_FAST=1``, threads and limits; the arm that goes first alternates between
rounds, so a change in machine load hits both. Overhead = sandboxed wall time / unsandboxed wall
time - 1, summed over the rounds (limit 10 %: exit 1 when missed). Then one learner's whole
workbook (every notebook with check cells) is graded in the sandbox with ``--jobs``: the time per
learner.

The homework (``10_homework``): one learner hands in the reference scripts (``solutions/homework``,
``train_cifar_pro.py`` as ``train_cifar.py``) in a ``homework/`` folder; all five upgrade checks run
on them with ``--jobs 1`` (one learner at a time, as a class is graded), ``--homework-rounds`` times
in the sandbox and as often without it, the arms alternating (limits: 3 minutes per learner in
the sandbox, 10 % overhead; exit 1 when missed).

    python bench/grading.py                                            # 20 learners x 01-03, --jobs 2
    python bench/grading.py --learners 1 --notebooks 01 --no-workbook  # a smoke run
    python bench/grading.py --learners 1 --notebooks 01 --no-workbook --homework-rounds 2   # the homework
    python bench/grading.py --learners 1 --notebooks 01 --no-workbook --homework-rounds 0 --class-learners 10

The last one adds the homework class with histories (``bench/grading_class.py``: bundles of five
upgrade commits and their realistic variants) graded with ``--jobs 1`` and ``--jobs 2``: seconds per
learner (limit 2 minutes), and the two must decide the same for every learner.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grading_class  # noqa: E402
from _common import REPO, format_table, header, machine_info, spread, write_json  # noqa: E402

import course_grader as grade  # noqa: E402
from course_grader.collect import collect  # noqa: E402
from course_tools.cells import NOTEBOOK_GLOB  # noqa: E402
from course_grader.plan import references  # noqa: E402
from course_grader.sandbox import check_available  # noqa: E402

MAX_OVERHEAD = 0.10
MAX_HOMEWORK_S = 180.0   # one learner's homework, all checks, --jobs 1, on a 2-core machine


def homework_arms(root: Path, solutions: Path, rounds: int, log) -> dict | None:
    """One learner's homework (the reference scripts) graded ``rounds`` times per arm, the arms alternating."""
    from course_grader.homework import NOTEBOOK, HomeworkSetup, grade_homework
    from course_grader.similarity import REFERENCE

    setup = HomeworkSetup.for_solutions(solutions)
    if setup is None:
        log(f"  {solutions} has no homework/ folder: homework not measured")
        return None
    folder = root / "learner" / "homework"
    folder.mkdir(parents=True)
    for name, text in setup.reference_scripts()[REFERENCE].items():
        (folder / name).write_text(text, encoding="utf-8")
    item = collect([root / "learner"], [], set(), NOTEBOOK)[0][0]
    runs, load_start = [], os.getloadavg()[0]
    for n in range(rounds):
        row = {}
        for arm in (("sandbox", "plain") if n % 2 == 0 else ("plain", "sandbox")):
            private = root / f"private-{n}-{arm}"
            private.mkdir()
            start = time.perf_counter()
            result = grade_homework(item, setup, sandbox=arm == "sandbox", private=private)
            row[arm] = time.perf_counter() - start
            row[f"{arm}_passed"] = f"{result.grade.passed}/{result.grade.total}"
            row[f"{arm}_failed"] = [c.message[:300] for c in result.grade.checks if not c.passed]
        runs.append(row)
        log(f"  homework round {n + 1}: sandbox {row['sandbox']:.1f} s ({row['sandbox_passed']}), "
            f"plain {row['plain']:.1f} s ({row['plain_passed']})")
    sandbox_s, plain_s = (statistics.median(r[a] for r in runs) for a in ("sandbox", "plain"))
    full = all(r["sandbox_passed"] == r["plain_passed"] == "5/5" for r in runs)
    return {"rounds": runs, "sandbox_s": sandbox_s, "plain_s": plain_s, "overhead": sandbox_s / plain_s - 1,
            "all_checks_passed": full, "max_seconds": MAX_HOMEWORK_S,
            "load_avg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)],
            "passed": full and sandbox_s <= MAX_HOMEWORK_S and sandbox_s / plain_s - 1 <= MAX_OVERHEAD}


def make_class(root: Path, solutions: Path, prefixes: list[str], learners: int) -> list[Path]:
    """``learners`` folders, each holding a copy of the reference notebooks named by ``prefixes``."""
    chosen = [p for p in sorted(solutions.glob(NOTEBOOK_GLOB)) if any(p.name.startswith(x) for x in prefixes)]
    for k in range(learners):
        folder = root / f"learner{k:02d}"
        folder.mkdir(parents=True)
        for path in chosen:
            shutil.copy(path, folder / path.name)
    return chosen


async def grade_round(items, released, options: grade.Options, private: Path) -> tuple[float, list]:
    """Grade ``items`` at the same time (len(items) <= jobs); wall seconds and the grades."""
    start = time.perf_counter()
    grades = await asyncio.gather(*(grade.grade_item(i, released[i.reference.name], options, private) for i in items))
    return time.perf_counter() - start, grades


async def compare(items, released, jobs: int, private: Path, log) -> list[dict]:
    sandboxed = grade.Options(jobs=jobs, sandbox=True)
    plain = grade.Options(jobs=jobs, sandbox=False)
    rounds = []
    for n, start in enumerate(range(0, len(items), jobs)):
        chunk = items[start:start + jobs]
        order = [("sandbox", sandboxed), ("plain", plain)] if n % 2 == 0 else [("plain", plain), ("sandbox", sandboxed)]
        row = {"notebooks": [f"{i.learner}/{i.reference.name}" for i in chunk]}
        for arm, options in order:
            seconds, grades = await grade_round(chunk, released, options, private)
            row[arm] = seconds
            row[f"{arm}_full"] = all(g.passed == g.total for g in grades)
        rounds.append(row)
        log(f"  round {n + 1}: {', '.join(row['notebooks'])}: sandbox {row['sandbox']:.1f} s, "
            f"plain {row['plain']:.1f} s")
    return rounds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--learners", type=int, default=20)
    p.add_argument("--notebooks", nargs="+", default=["01", "02", "03"], help="reference name prefixes")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--solutions", type=Path, default=REPO / "solutions")
    p.add_argument("--no-workbook", action="store_true", help="skip the whole-workbook time per learner")
    p.add_argument("--homework-rounds", type=int, default=1, help="homework gradings per arm (0: skip the homework)")
    p.add_argument("--class-learners", type=int, default=0,
                   help="also grade a homework class with histories (bench/grading_class.py), --jobs 1 and 2")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    info = machine_info()
    print(header(info))
    check_available()
    paths, released = references(args.solutions)
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        tmp = Path(tmp)
        chosen = make_class(tmp / "class", args.solutions, args.notebooks, args.learners)
        items, _ = collect([tmp / "class"], paths, set(released))
        items = [i for i in items if i.path is not None]
        private = tmp / "private"
        private.mkdir()
        print(f"{args.learners} learners x {[c.name for c in chosen]}, --jobs {args.jobs}, {len(items)} notebooks per arm")
        rounds = asyncio.run(compare(items, released, args.jobs, private, print))
        workbook = None
        if not args.no_workbook:
            make_class(tmp / "one", args.solutions, [p.name.split("_")[0] + "_" for p in paths if p.name in released], 1)
            start = time.perf_counter()
            grades = grade.grade_all([tmp / "one"], args.solutions, grade.Options(jobs=args.jobs), verbose=False)
            workbook = {"seconds": time.perf_counter() - start, "notebooks": len(grades),
                        "full": all(g.passed == g.total for g in grades),
                        "per_notebook": {g.notebook: f"{g.passed}/{g.total}" for g in grades}}
        homework = homework_arms(tmp / "homework", args.solutions, args.homework_rounds, print) \
            if args.homework_rounds else None
    sandbox_s, plain_s = sum(r["sandbox"] for r in rounds), sum(r["plain"] for r in rounds)
    overhead = sandbox_s / plain_s - 1
    ratios = spread([r["sandbox"] / r["plain"] for r in rounds])
    full = all(r["sandbox_full"] and r["plain_full"] for r in rounds)
    table = format_table([["sandbox (bubblewrap)", sandbox_s, sandbox_s / args.learners],
                          ["no sandbox", plain_s, plain_s / args.learners]],
                         ["arm", "wall s (all rounds)", f"s per learner ({len(chosen)} notebooks)"])
    table += (f"\n\nper-round sandbox/plain ratio: median {ratios['median']:.3f}, min {ratios['min']:.3f}, "
              f"max {ratios['max']:.3f} ({ratios['n']} rounds)")
    table += f"\nevery check passed in both arms: {full}"
    if workbook:
        table += (f"\nwhole workbook, one learner, sandboxed, --jobs {args.jobs}: {workbook['seconds']:.0f} s for "
                  f"{workbook['notebooks']} notebooks (all checks passed: {workbook['full']})")
    passed = overhead <= MAX_OVERHEAD and full
    table += f"\noverhead of the sandbox: {100 * overhead:.1f}% (limit {100 * MAX_OVERHEAD:.0f}%) -> {'OK' if passed else 'FAILED'}"
    if homework:
        h = homework
        table += (f"\nhomework, one learner (reference scripts), all 5 upgrade checks, --jobs 1, median of "
                  f"{len(h['rounds'])} round(s): sandbox {h['sandbox_s']:.0f} s (limit {MAX_HOMEWORK_S:.0f} s), "
                  f"no sandbox {h['plain_s']:.0f} s, overhead {100 * h['overhead']:.1f}% "
                  f"(limit {100 * MAX_OVERHEAD:.0f}%), all checks passed: {h['all_checks_passed']} "
                  f"-> {'OK' if h['passed'] else 'FAILED'}")
        passed = passed and h["passed"]
    homework_class, class_lines = {}, []
    for jobs in (1, 2) if args.class_learners else ():
        homework_class[jobs] = grading_class.grade_class(args.class_learners, jobs, log=print)
        c = homework_class[jobs]
        class_lines.append(f"homework class with histories ({args.class_learners} learners, bench/grading_class.py), "
                           f"--jobs {jobs}: {c['seconds_per_learner']:.0f} s per learner (limit {c['max_seconds']:.0f} s), "
                           f"{sum(r['runs'] for r in c['learners'])} check runs -> {'OK' if c['passed'] else 'FAILED'}")
    if len(homework_class) == 2 and grading_class.same_verdicts(homework_class[2], homework_class[1]):
        class_lines.append("homework class: --jobs 2 decided differently from --jobs 1 -> FAILED")
    if homework_class:
        class_ok = all(c["passed"] for c in homework_class.values()) and not class_lines[-1].endswith("FAILED")
        passed = passed and class_ok
        table += "\n" + "\n".join(class_lines)
        write_json("grading_class", {"machine": info, "learners": args.class_learners, "jobs": homework_class,
                                     "table": "\n".join(class_lines), "passed": class_ok})
    print()
    print(table)
    path = write_json("grading", {"machine": info, "learners": args.learners, "notebooks": [c.name for c in chosen],
                                  "jobs": args.jobs, "rounds": rounds, "sandbox_s": sandbox_s, "plain_s": plain_s,
                                  "overhead": overhead, "max_overhead": MAX_OVERHEAD, "ratio": ratios,
                                  "all_checks_passed": full, "workbook": workbook, "homework": homework,
                                  "passed": passed, "table": table},
                      args.json)
    print(f"\nJSON: {path}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
