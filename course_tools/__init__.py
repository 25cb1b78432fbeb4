"""Course machinery for the chapter 0.4 workbook: what instructors and authors run, not what learners reuse.

- ``checks``    one module per notebook: the self-checks called from ``check`` cells
                (``nb10_homework`` runs the learner's homework scripts; ``upgrades`` lists them)
- ``quiz``      self-test questions with widgets and a plain-text fallback
- ``ledger``    the learner's ledger of checks run (passed, failed, not started) and hints seen
- ``progress``  the dashboard read from it (``python -m course_tools.progress``); the display width of text
- ``release``   generates ``notebooks/`` from ``solutions/`` (``python -m course_tools.release``)
- ``cells``     the notebook glob and the cell tags (``exercise``, ``check``, ``solution-only``)
- ``claims``    ``claim()``: a notebook sentence about a computed value, checked where it is computed
- ``lab``       the apparatus of the long experiments: ``checkpoint_resume`` (04: kill-and-resume) and
  ``multi_process`` (11: torchrun, ranks, kills)
- ``grade``     the old name of the instructor's grader: ``python -m course_tools.grade`` prints one line and
  hands over to ``python -m course_grader``, the grader's own package (with its sandbox), which nothing in
  ``course_tools`` imports
- ``noninteractive``  the environment of every non-interactive run (tests, grading, homework checks)
- ``probes``    the professional script's hidden flags (NaN steps, bad batches, the sample ledger) for tests and demos
- ``cputime``   CPU seconds of a process tree: the time limits of the checks and the grader

Rule: ``course_tools`` imports ``course_utils``; ``course_utils`` never imports ``course_tools``
(``tests/test_layout.py`` checks the import graph).
"""
