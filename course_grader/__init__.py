"""The instructor's grader: each learner's notebooks and homework, graded against the reference in ``solutions/``.

Each graded notebook is rebuilt from the released reference with only the learner's ``exercise`` cells put in
(editing a check cell changes nothing), run in a fresh kernel inside a bubblewrap sandbox and scored by the
grader itself: score = check cells passed / check cells in the reference. A cell past its time limit is
interrupted and the notebook run again with that exercise stubbed, so the others still earn their marks.
Exercises that reach the check machinery are flagged for review and run as stubs. The homework
(``10_homework``) is one more row per learner: each upgrade's check on the learner's scripts, and the commit
history's discipline when one is handed in. Without bubblewrap the grader stops; ``--no-sandbox`` is for
trusted code only (the learner's code then runs as you) and says so in every row.

    python -m course_grader submissions/ --report grades.csv --jobs 2
    python -m course_grader submissions/ --report grades.csv --resume             # after an interruption
    python -m course_grader submissions/ --report grades.csv --only alice,sec2/bob  # grade again, merge in
    python -m course_grader submissions/ --report new.csv --regrade grades.csv   # re-run what changed
    python -m course_grader submissions/ --report part1.csv --shard 1/2          # on machine 1 of 2
    python -m course_grader merge part1.csv part2.csv --report grades.csv
    python -m course_grader export grades.csv --format canvas --roster roster.csv  # or moodle, xlsx

Written next to --report grades.csv: grades.csv (a row per learner x notebook), grades.checks.csv (a row
per check), grades.files.csv (every file met, and why), grades.pass_rate.csv, grades.similarity.csv (pairs
of learners whose scripts are alike, for a person to look at), grades.diff.csv (--regrade: the verdicts
that changed), grades.html and grades_feedback/ (a page per learner).
"""
from __future__ import annotations

from course_grader.cli import main
from course_grader.pipeline import ROOT, Options, grade_all, grade_item
from course_grader.pipeline import _shard  # noqa: F401 - the shard rule, tested here

__all__ = ["ROOT", "Options", "grade_item", "grade_all", "main"]
