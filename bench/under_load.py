"""Verdicts under load: run tests with CPU hogs beside them and show that they still pass.

The homework checks kill a script at an exact optimizer step (``course_utils.interrupt``) and
limit each run, each graded cell and each notebook in CPU seconds (``course_tools.cputime``), so a
busy machine must not change a single verdict. This bench starts ``--hogs`` plain Python busy
loops (default: 2 per core), runs pytest on the tests that once failed under load (issue 29),
samples the load average every 5 s, then stops the hogs. The tests assert the quiet machine's
verdicts, so "all passed" means "the same verdicts as on a quiet machine".

    python bench/under_load.py                       # the default tests below
    python bench/under_load.py tests/test_homework.py -m slow   # any pytest arguments
    python bench/under_load.py --hogs 0              # the same tests on a quiet machine

Writes bench/results/under_load.json.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import REPO, header, machine_info, write_json  # noqa: E402

from course_tools.cputime import cpu_hogs  # noqa: E402

# The tests issue 29 names (each failed once at load 10-14), and the homework checks' verdict tests.
DEFAULT = ["tests/test_homework.py", "tests/test_homework_learner.py", "tests/test_grade_homework.py",
           "tests/test_grade_hostile.py"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hogs", type=int, default=2 * (os.cpu_count() or 1),
                   help="busy loops, each in its own session (default: 2 per core)")
    args, pytest_args = p.parse_known_args()
    pytest_args = pytest_args or [*DEFAULT, "-p", "no:cacheprovider"]
    info = machine_info()
    print(header(info))
    loads: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(5.0):
            loads.append(os.getloadavg()[0])

    with cpu_hogs(args.hogs):
        time.sleep(10 if args.hogs else 0)  # let the 1-minute load average climb before the tests start
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start = time.monotonic()
        # -rfEs last: failures, errors and skip reasons are always listed in the summary
        out = subprocess.run([sys.executable, "-m", "pytest", *pytest_args, "-rfEs"], cwd=REPO, capture_output=True,
                             text=True)
        seconds = time.monotonic() - start
        stop.set()
    counts = [line for line in out.stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    summary = counts[-1] if counts else "no summary"
    failed = [line for line in out.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    skipped = [line for line in out.stdout.splitlines() if line.startswith("SKIPPED")]
    log = Path(tempfile.gettempdir()) / "under_load.pytest.log"
    log.write_text(out.stdout + out.stderr, encoding="utf-8")
    result = {"hogs": args.hogs, "pytest_args": pytest_args, "exit_code": out.returncode, "summary": summary.strip("= "),
              "failed": failed, "skipped": skipped, "seconds": round(seconds, 1),
              "load_1min": {"min": min(loads, default=None), "median": statistics.median(loads) if loads else None,
                            "max": max(loads, default=None), "samples": len(loads)}}
    print(f"hogs {args.hogs}: pytest {' '.join(pytest_args)}")
    print(f"  {result['summary']} in {seconds:.0f} s, exit {out.returncode}")
    print(f"  1-minute load average: min {result['load_1min']['min']}, median {result['load_1min']['median']}, "
          f"max {result['load_1min']['max']} ({len(loads)} samples)")
    for line in failed + skipped:
        print("  " + line)
    print(f"  pytest's whole output: {log}")
    write_json("under_load", {"machine": info, **result})
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
