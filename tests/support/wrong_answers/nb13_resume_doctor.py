"""Typical wrong answers of notebook 13_resume_doctor: the capstone's save_checkpoint and load_checkpoint.

Each is the solution with some of the four resume defects of the learner's trainer put back
(``course_tools.lab.capstone.DEFECTS``, which comments where each is found in real trainers): the untouched
copy (all four), and every variant with exactly one defect left, the state a learner is in after fixing
three. Used by tests/support/exercise_registry.py and tests/test_nb13_resume_doctor.py.
"""
from __future__ import annotations

from course_tools.lab.capstone import DEFECTS, with_defects

# the doctor's component each defect shows as first (its report's "component", named in the check's message)
COMPONENT = {"fp16 weights": "weights", "scheduler not saved": "scheduler", "data order restarted": "data",
             "no RNG state": "rng"}
assert COMPONENT.keys() == DEFECTS.keys()

# name -> (the defects left in the solution, a fragment the failure message must contain)
WRONG: dict[str, tuple[tuple[str, ...], str]] = {
    # the learner's copy as handed out: the doctor names the first defect it meets (the fp16 weights, at load)
    "untouched learner copy": (tuple(DEFECTS), f"[{COMPONENT['fp16 weights']}]"),
    # three fixed, one left: each must still fail, naming the one left
    **{f"only {name} left": ((name,), f"[{COMPONENT[name]}]") for name in DEFECTS},
}


def mutant(solution: str, defects: tuple[str, ...]) -> str:
    """The solution's exercise cell with ``defects`` put back."""
    return with_defects(solution, defects)
