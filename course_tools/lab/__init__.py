"""The lab apparatus of the long experiments: what a notebook calls so that its cells show only what a learner
must read (reference machinery, not taught).

- ``checkpoint_resume``: 04's plots, measurement and kill-and-resume launcher;
- ``multi_process``: 11's launchers, timing choreography and bookkeeping (torchrun, ranks, kills);
- ``capstone``: 13's capstone: the tiny LM trainer (``train_tiny_lm``, the reference), its four resume defects,
  the learner's copy and the resume doctor run on it.
"""

__all__: list[str] = []  # import the modules themselves: ``from course_tools.lab.multi_process import run_ranks``
