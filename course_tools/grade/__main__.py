"""``python -m course_tools.grade``: the command line (:func:`course_tools.grade.cli.main`)."""
import sys

from course_tools.grade import main

sys.exit(main())
