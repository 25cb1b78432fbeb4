"""``python -m course_grader``: the command line (:func:`course_grader.main`)."""
from course_grader import main

raise SystemExit(main())
