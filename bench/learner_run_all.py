"""A learner's Run All of every released notebook, untouched, in a fresh clone: does every code cell run once?

Issue 33: an exercise still holding its stub must not stop Run All (its check prints a calm "还没做"
note in a learner's own Jupyter kernel), so a newcomer sees every demonstration without restarting
below each stop. This clones the repository (committed state) into a scratch folder, and executes each
``notebooks/NN_*.ipynb`` there as JupyterLab's Run All does: one kernel over ZMQ, cells in order, stop
at the first error, with ``COURSE_FAST=1`` as the README says for a CPU and without ``COURSE_CHECKS``
(a learner's kernel, not the grader's). Per notebook: seconds, code cells run of all, errors, and the
"⏳ 还没做" notes seen. Exit 1 when any code cell did not run.

    python bench/learner_run_all.py                  # all notebooks (about 8 minutes on 2 cores)
    python bench/learner_run_all.py --only 07 10     # some
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, format_table, header, machine_info, write_json  # noqa: E402


def run_notebook(path: Path, cwd: Path, timeout: int) -> dict:
    """Execute ``path`` like Run All; what ran."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})
    start = time.perf_counter()
    error = ""
    try:
        client.execute()
    except CellExecutionError as exc:
        error = str(exc).strip().splitlines()[-1][:200]
    seconds = time.perf_counter() - start
    code = [c for c in nb.cells if c.cell_type == "code"]
    ran = [c for c in code if c.get("execution_count")]
    text = "".join(o.get("text", "") for c in code for o in c.get("outputs", []) if o.get("output_type") == "stream")
    return {"notebook": path.name, "seconds": round(seconds, 1), "code_cells": len(code), "ran": len(ran),
            "not_started_notes": text.count("⏳ 还没做"), "error": error}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=None, help="notebook number prefixes")
    p.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    info = machine_info()
    print(header(info))
    rows = []
    with tempfile.TemporaryDirectory(prefix="run-all-") as tmp:
        clone = Path(tmp) / "workbook"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        os.environ["COURSE_FAST"] = "1"
        os.environ.pop("COURSE_CHECKS", None)
        os.environ["COURSE_PROGRESS"] = str(Path(tmp) / "progress.json")
        paths = sorted((clone / "notebooks").glob("[0-9]*.ipynb"))
        if args.only:
            paths = [q for q in paths if q.name.split("_")[0] in args.only]
        for path in paths:
            rows.append(run_notebook(path, clone / "notebooks", args.timeout))
            r = rows[-1]
            print(f"  {r['notebook']}: {r['ran']}/{r['code_cells']} code cells in {r['seconds']:.0f} s, "
                  f"{r['not_started_notes']} not-started notes{', ERROR ' + r['error'] if r['error'] else ''}")
    ok = all(r["ran"] == r["code_cells"] and not r["error"] for r in rows)
    table = format_table([[r["notebook"], r["seconds"], f"{r['ran']}/{r['code_cells']}", r["not_started_notes"],
                           r["error"] or "-"] for r in rows],
                         ["notebook", "s", "code cells run", "⏳ notes", "error"])
    table += f"\n\nevery code cell of every notebook ran once, no restart: {ok}"
    print("\n" + table)
    path = write_json("learner_run_all", {"machine": info, "rows": rows, "passed": ok, "table": table}, args.json)
    print(f"\nJSON: {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
