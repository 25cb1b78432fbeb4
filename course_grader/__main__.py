"""``python -m course_grader``: the command line (:func:`course_grader.main`)."""
import sys

from course_grader import main

sys.exit(main())
