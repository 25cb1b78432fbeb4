"""The old name of the instructor's grader, kept so ``python -m course_tools.grade ...`` still works.

The grader is its own package now, ``course_grader`` (``python -m course_grader --help``): the
notebook runtime (checks, lab, quiz, ledger, dashboard, release) stays in ``course_tools``, which
never imports the grader. ``python -m course_tools.grade ARGS`` prints one line naming the new
command and hands over to it with the same arguments (:mod:`course_tools.grade.__main__`).
"""

__all__: list[str] = []
