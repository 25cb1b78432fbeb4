"""``python -m course_tools.grade ARGS``: one line naming ``python -m course_grader``, then that command, same ARGS.

The hand-over goes through :func:`runpy.run_module` by name, so ``course_tools`` never imports the
grader (``tests/test_layout.py``); ``sys.argv`` is left as it is, so every flag reaches the grader.
"""
import runpy
import sys

print("python -m course_tools.grade 已改名为 python -m course_grader(参数相同),现在转交给它", file=sys.stderr)
runpy.run_module("course_grader", run_name="__main__")
