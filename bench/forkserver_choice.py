"""The tests' fork server (tests/support/forkserver.py) against the standard library's forkserver with a preload.

Issue 31 asked to try ``multiprocessing``'s forkserver (``set_forkserver_preload(["torch"])``) before keeping
the custom protocol. Both fork a process that imported torch once; this measures, one after another in one run,
the time from start to exit of a tiny torch script (median of ``--runs``), and what each gives a test without
extra code: the run's own output pipe, ``atexit`` at the end, the exit status of ``sys.exit(7)``. The standard
library's child writes to the server's stdout and skips ``atexit`` (multiprocessing ends forkserver and fork
children with ``os._exit``): matching a real interpreter would take the same fd passing, session, cwd, environment and
end-of-run code the custom server already has, so it is kept.

    python bench/forkserver_choice.py            # writes bench/results/forkserver_choice.json
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, format_table, header, machine_info, write_json  # noqa: E402

sys.path.insert(0, str(REPO))
from tests.support.forkserver import ForkServer  # noqa: E402

SCRIPT = """import atexit, sys, torch
if __name__ == "__main__":  # ForkServer imports the script once (its __main__ block does not run there)
    atexit.register(lambda: open(__file__ + ".atexit", "a").write("x"))
    print(float(torch.ones(3).sum()), flush=True)
    sys.exit(7)
"""


def run_path(script: str) -> None:  # the standard library's child: what a test would hand it
    sys.argv = [script]
    runpy.run_path(script, run_name="__main__")


def timed(start, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        start()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args(argv)
    info = machine_info()
    print(header(info))
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "tiny.py"
        script.write_text(SCRIPT, encoding="utf-8")

        def fresh():
            proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
            return proc.returncode, proc.stdout

        ours_server = ForkServer(script)

        def ours():
            run = ours_server.start([])
            out, _ = run.communicate(60)
            return run.returncode, out

        context = mp.get_context("forkserver")
        context.set_forkserver_preload(["torch"])

        def stdlib():  # its output goes to the forkserver's stdout, not to a pipe of this run: None, by construction
            process = context.Process(target=run_path, args=(str(script),))
            process.start()
            process.join()
            return process.exitcode, None

        stdlib()  # starts the server (imports torch once), as ForkServer() did above
        rows, found = [], {}
        marker = Path(str(script) + ".atexit")
        for name, start in (("fresh interpreter", fresh), ("tests/support/forkserver.py", ours),
                            ("multiprocessing forkserver + preload", stdlib)):
            marker.unlink(missing_ok=True)
            code, out = start()
            found[name] = {"exit_code": code, "output_captured": out is not None and "3.0" in out,
                           "atexit_ran": marker.exists(), "median_s": timed(start, args.runs)}
            rows.append([name, found[name]["median_s"], code, found[name]["output_captured"], found[name]["atexit_ran"]])
        ours_server.close()
    text = format_table(rows, ["launcher", "median start-to-exit (s)", "exit code of sys.exit(7)",
                               "own output pipe", "atexit ran"])
    print(text)
    path = write_json("forkserver_choice", {"machine": info, "runs": args.runs, "launchers": found, "table": text})
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
