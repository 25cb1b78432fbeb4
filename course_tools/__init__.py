"""Course machinery for the chapter 0.4 workbook: what instructors and authors run, not what learners reuse.

- ``checks``    one module per notebook: the self-checks of ``check`` cells (``nb10_homework``: the homework)
- ``quiz``      self-test questions;  ``ledger``  the learner's checks and hints;  ``progress``  their dashboard
- ``release``   generates ``notebooks/`` from ``solutions/``;  ``cells``  the notebook glob and the cell tags
- ``claims``    ``claim()``: a notebook sentence about a computed value, checked where it is computed
- ``lab``       the apparatus of the long experiments (04's kill-and-resume, 11's torchrun, 13's capstone)
- ``grade``     the old name of the grader: hands over to ``python -m course_grader``, which nothing here imports
- ``noninteractive``  the environment of every non-interactive run;  ``cputime``  CPU seconds of a process tree
- ``probes``    the professional script's hidden flags (NaN steps, bad batches, the sample ledger, stalls)

Rule: ``course_tools`` imports ``course_utils``, never ``course_grader``; ``course_utils`` imports neither
(``tests/test_layout.py``).
"""
