"""The instructor's grader: learners' notebooks and homework against the reference in ``solutions/``.

Its own package, beside ``course_tools`` (the notebook runtime: checks, lab, quiz, ledger, dashboard,
release), which never imports it; ``python -m course_tools.grade`` still works and hands over here.

For each learner and each reference notebook that has ``check`` cells, the grader builds the
notebook to run from the reference, as released (solutions stripped, ``solution-only`` cells
dropped): every cell comes from the reference except the source of the ``exercise`` cells, which
comes from the learner. Editing or deleting a check cell therefore changes nothing. The notebook
runs in a fresh kernel inside a bubblewrap sandbox (:mod:`course_grader.sandbox`) and the grader
decides each check's outcome itself, from the kernel's execute replies
(:mod:`course_grader.kernel`); the self-test answers are scored outside the kernel
(:mod:`course_grader.answers`).

    score = check cells passed / check cells in the reference

Partial credit survives loops and crashes: a cell past ``--cell-timeout`` CPU seconds (or five times
that in wall time: code that sleeps) is interrupted (and the kernel killed if the cell ignores the
interrupt for 10 s); a dead kernel is noticed at once. The notebook is then run again with the
offending exercise (the one running, or the last one run before the cell that failed) replaced by
its stub, at most once per exercise, so the other exercises still earn their marks. ``--timeout`` is
a hard limit per notebook, in CPU seconds of all its runs (five times that in wall time). Limits in
CPU time give the same grades on a busy machine. A notebook that cannot be graded
keeps its total (score 0 with the reason). Exercise sources that reach the check machinery or
the runtime are flagged for manual review (:mod:`course_grader.scan`) and run as stubs
(``--run-flagged`` runs them anyway, after review).

    python -m course_grader submissions/ --report grades.csv --jobs 2
    python -m course_grader submissions/ --report part1.csv --shard 1/2     # on machine 1
    python -m course_grader merge part1.csv part2.csv --report grades.csv
    python -m course_grader submissions/ --report grades.csv --resume      # after an interruption
    python -m course_grader submissions/ --report grades.csv --require-commits  # discipline counts
    python -m course_grader submissions/ --report grades.csv --only alice,sec2/bob  # regrade, merge in
    python -m course_grader submissions/ --report new.csv --regrade grades.csv   # re-run what changed: new.diff.csv
    python -m course_grader export grades.csv --format canvas --roster roster.csv  # or moodle, xlsx

The homework (``10_homework``: the learner's training scripts, when ``solutions/homework/`` holds the
reference scripts) is one more row per learner, graded by :mod:`course_grader.homework`: each
upgrade's check runs here, every run of the learner's scripts in its own sandbox; the commit
history, when handed in, is judged too (``--require-commits`` lets it change the score), and
``grades.similarity.csv`` lists the pairs of learners (and learner x reference) whose scripts
are alike, for a person to look at (:mod:`course_grader.similarity`).

The steps are code, in one place (:mod:`course_grader.steps`, nbgrader's idea of a list of
preprocessors): each step is one module with one function ``step(sub)`` over one
:class:`~course_grader.submission.Submission` record, and the row is built from the final record.

- a notebook (:mod:`~course_grader.notebook`): ``regrade`` (stamp the row: each check's version, Python,
  torch, the submission's hash; ``--regrade OLD.csv`` keeps a row whose stamp still matches and runs
  nothing), ``plan`` (read the submission, merge its exercises into the released reference), ``scan`` (flagged exercises run as stubs), ``kernel`` (the sandboxed run, with reruns),
  ``answers`` (each check's outcome, the self-test answers scored outside the kernel);
- the homework (:mod:`~course_grader.homework`): ``hand_in`` (history and scripts, copied safely),
  ``regrade``, ``upgrades`` (each upgrade's check, every run sandboxed), ``discipline`` (the commit walk
  and its verdict: ``commits`` reads the history).

Around them: ``collect`` (every learner and submitted file -> ``Item`` rows and ``Finding`` lines);
``pipeline`` (a class: collect, shard, grade each item, report); ``report`` (rows to CSV, feedback,
pass rates, merged shards); ``html_report`` and ``class_stats`` (``grades.html`` and the feedback pages, with each failed check's
hint tier 1 and reproduce step); ``similarity`` (near-copies among the learners' scripts, and the
lines two flagged scripts share); ``export`` (the gradebook an LMS imports);
``sandbox`` (bubblewrap, limits, cgroups); ``options`` and ``cli``.

Without bubblewrap the grader stops with an explanation; ``--no-sandbox`` grades anyway (trusted
code only: the learner's code then runs as you) and says so in every row.
"""
from __future__ import annotations

from course_grader.cli import main
from course_grader.notebook import grade_item
from course_grader.options import Options
from course_grader.pipeline import ROOT, _shard, grade_all  # noqa: F401 - _shard: the shard rule, tested here

__all__ = ["ROOT", "Options", "grade_item", "grade_all", "main"]
