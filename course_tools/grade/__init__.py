"""Grade learners' notebooks against the reference in ``solutions/`` (instructor tool).

For each learner and each reference notebook that has ``check`` cells, the grader builds the
notebook to run from the reference, as released (solutions stripped, ``solution-only`` cells
dropped): every cell comes from the reference except the source of the ``exercise`` cells, which
comes from the learner. Editing or deleting a check cell therefore changes nothing. The notebook
runs in a fresh kernel inside a bubblewrap sandbox (:mod:`course_tools.sandbox`) and the grader
decides each check's outcome itself, from the kernel's execute replies
(:mod:`course_tools.grade.kernel`); the self-test answers are scored outside the kernel
(:mod:`course_tools.grade.answers`).

    score = check cells passed / check cells in the reference

Partial credit survives loops and crashes: a cell past ``--cell-timeout`` CPU seconds (or five times
that in wall time: code that sleeps) is interrupted (and the kernel killed if the cell ignores the
interrupt for 10 s); a dead kernel is noticed at once. The notebook is then run again with the
offending exercise (the one running, or the last one run before the cell that failed) replaced by
its stub, at most once per exercise, so the other exercises still earn their marks. ``--timeout`` is
a hard limit per notebook, in CPU seconds of all its runs (five times that in wall time). Limits in
CPU time give the same grades on a busy machine. A notebook that cannot be graded
keeps its total (score 0 with the reason). Exercise sources that reach the check machinery or
the runtime are flagged for manual review (:mod:`course_tools.grade.scan`) and run as stubs
(``--run-flagged`` runs them anyway, after review).

    python -m course_tools.grade submissions/ --report grades.csv --jobs 2
    python -m course_tools.grade submissions/ --report part1.csv --shard 1/2     # on machine 1
    python -m course_tools.grade merge part1.csv part2.csv --report grades.csv
    python -m course_tools.grade submissions/ --report grades.csv --resume      # after an interruption
    python -m course_tools.grade submissions/ --report grades.csv --require-commits  # discipline counts
    python -m course_tools.grade submissions/ --report grades.csv --only alice,sec2/bob  # regrade, merge in
    python -m course_tools.grade export grades.csv --format canvas --roster roster.csv  # or moodle, xlsx

The homework (``10_homework``: the learner's training scripts, when ``solutions/homework/`` holds the
reference scripts) is one more row per learner, graded by :mod:`course_tools.grade.homework`: each
upgrade's check runs here, every run of the learner's scripts in its own sandbox; the commit
history, when handed in, is judged too (``--require-commits`` lets it change the score), and
``grades.similarity.csv`` lists the pairs of learners (and learner x reference) whose scripts
are alike, for a person to look at (:mod:`course_tools.grade.similarity`).

One step per module, nbgrader-style, each handing the next one small value:

- ``collect``: every learner and submitted file -> ``Item`` rows and ``Finding`` lines;
- ``plan``: read a submission, merge its exercises into the released reference -> ``Plan``;
- ``scan``: the tamper scan of the learner's exercise sources -> ``Flag`` lines (in the ``Plan``);
- ``kernel``: run a ``Plan``'s cells in a sandboxed kernel -> ``RunResult`` (per cell: ``CellResult``);
- ``answers``: the checks scored outside the kernel (the self-test answers) -> (passed, message);
- ``notebook``: one learner x notebook, from ``Item`` to ``Grade`` (plan, kernel, reruns, answers);
- ``homework`` (``homework_files``: the handed-in files, copied safely): one learner's homework scripts
  through the upgrade checks -> ``Grade``;
- ``commits``: the homework's git history, read safely -> ``History`` (its ``Commit`` list);
- ``discipline``: the verdict on those commits (one upgrade per commit, in order) -> ``Discipline``;
- ``similarity``: near-copies among the learners' scripts -> ``SimilarityRow``;
- ``report``: ``Grade`` rows to CSV, feedback, pass rates, merged shards;
- ``html_report``: ``grades.html`` and the HTML feedback pages (``class_stats``: distributions, pass rates,
  discrimination, plots; ``check_guide``: hint tier 1 and the reproduce step; ``side_by_side``: the lines two
  flagged scripts share);
- ``export``: the gradebook an LMS imports (Canvas, Moodle CSV; xlsx), through a roster;
- ``pipeline``: a class (collect, shard, grade each item, report); ``options``: the run's settings;
  ``cli``: the command line.

Without bubblewrap the grader stops with an explanation; ``--no-sandbox`` grades anyway (trusted
code only: the learner's code then runs as you) and says so in every row.
"""
from __future__ import annotations

from course_tools.grade.cli import main
from course_tools.grade.notebook import grade_item
from course_tools.grade.options import Options
from course_tools.grade.pipeline import ROOT, _shard, grade_all  # noqa: F401 - _shard: the shard rule, tested here

__all__ = ["ROOT", "Options", "grade_item", "grade_all", "main"]
