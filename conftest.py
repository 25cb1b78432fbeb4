"""Test-session settings shared by the unit tests and the nbval notebook runs.

Set before any kernel starts, so notebook kernels inherit them.
"""
import os

from course_tools.claims import STRICT_ENV
from course_tools.quiet import quiet_environ

os.environ.update(quiet_environ())  # small sizes, same code path; wandb offline and silent
os.environ.update(STRICT_ENV)       # a notebook sentence contradicted by its own output fails the run


def pytest_configure(config):
    """The tests run checks and small trainings in this process: same CPU thread policy as the notebooks."""
    from course_utils.env import configure_cpu_threads
    configure_cpu_threads()
