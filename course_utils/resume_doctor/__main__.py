"""``python -m course_utils.resume_doctor``: the command line of :mod:`course_utils.resume_doctor.cli`.

Reference machinery of the resume doctor, which the homework checks share
(``course_tools/checks/homework_resume.py``).
"""
import sys

from course_utils.resume_doctor.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
