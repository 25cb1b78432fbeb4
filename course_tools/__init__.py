"""Course machinery for the chapter 0.4 workbook: what instructors and authors run, not what learners reuse.

- ``checks``   one module per notebook: the self-checks called from ``check`` cells
               (``nb10_homework`` runs the learner's homework scripts)
- ``quiz``     self-test questions with widgets and a plain-text fallback
- ``release``  generates ``notebooks/`` from ``solutions/`` (``python -m course_tools.release``)
- ``claims``   ``claim()``: a notebook sentence about a computed value, checked where it is computed
- ``grade``    grades learners' notebooks (``python -m course_tools.grade``), built from one module per step:
  ``grade_collect`` (find every submission, account for every file), ``sandbox`` (the bubblewrap kernel),
  ``grade_kernel`` (run cells, decide outcomes from the kernel's replies), ``grade_scan`` (flag tampering),
  ``grade_answers`` (self-test answers scored outside the kernel), ``grade_report`` (CSV, feedback, merge)
- ``quiet``    the environment of every non-interactive run (tests, grading, homework checks)

Rule: ``course_tools`` imports ``course_utils``; ``course_utils`` never imports ``course_tools``
(``tests/test_layout.py`` checks the import graph).
"""
