"""Stored-output claims beside CPU hogs: run solution notebooks N times, record each ``claim``, count how often it held.

Issue 49 item 4: a notebook sentence that compares wall-clock times or time shares must hold beside 4 CPU hogs, or
be stated with its measured spread. This bench executes the given solution notebooks ``--repeats`` times, one after
the other, with ``--hogs`` plain Python busy loops beside them (``course_tools.cputime.cpu_hogs``, each in its own
session) and the environment of ``release --execute`` (``COURSE_FAST=1``, wandb offline, no progress ledger; torch's
threads follow ``configure_cpu_threads``), except that claims run in record mode (``COURSE_CLAIMS=record:<file>``,
``course_tools.claims``): a claim that fails is written down and the notebook goes on. Notebooks run in memory
(``solutions/`` is not rewritten), only up to their last cell that calls ``claim(`` (``--no-upto-last-claim``: whole).

    python bench/claims_under_load.py --repeats 10 --hogs 4            # the notebooks of issue 49's list
    python bench/claims_under_load.py --repeats 1 --hogs 0 06 08b      # one quiet run of 06 and 08b, to time them
    python bench/claims_under_load.py 04:36 06                         # 04 up to its cell 36 (0-based), 06 as usual

Prints the machine, the load average, each notebook's run times and a table: notebook, claim, held k/N, and
min/median/max of each number the claim compared. Writes bench/results/claims_under_load.json (every claim of
every run, with its values).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import REPO, format_table, header, machine_info, write_json  # noqa: E402

from course_tools.claims import RECORD_PREFIX  # noqa: E402
from course_tools.cputime import cpu_hogs  # noqa: E402
from course_tools.noninteractive import quiet_environ  # noqa: E402

SOLUTIONS = REPO / "solutions"
# The notebooks whose stored outputs hold claims about wall-clock times or time shares (issue 49 item 4)
DEFAULT = ["01", "04", "05", "06", "07", "08_", "08b", "11"]
SHOWN = 44  # characters of a statement in the printed table (the JSON keeps it whole)


def notebooks(prefixes: list[str]) -> list[tuple[Path, int | None]]:
    """The solution notebooks whose names start with one of ``prefixes`` (``08_`` is 08 without 08b), each with
    the last cell to run when the prefix names one (``04:36``: cells 0 to 36), else None."""
    last = {prefix.partition(":")[0]: int(prefix.partition(":")[2]) if ":" in prefix else None for prefix in prefixes}
    found = [(p, next(cell for x, cell in last.items() if p.name.startswith(x)))
             for p in sorted(SOLUTIONS.glob("[0-9][0-9]*_*.ipynb")) if any(p.name.startswith(x) for x in last)]
    if not found:
        raise SystemExit(f"no solution notebook starts with {' or '.join(last)}")
    return found


def last_claim_cell(cells: list[dict]) -> int:
    """Index of the last code cell that calls ``claim(`` (-1: none)."""
    calls = [i for i, c in enumerate(cells)
             if c.get("cell_type") == "code" and "claim(" in "".join(c.get("source", ""))]
    return calls[-1] if calls else -1


def read_records(path: Path) -> list[dict[str, Any]]:
    """The claims one run recorded, in order (a line cut short by a killed kernel is skipped)."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def execute(path: Path, record: Path, upto: int | None, upto_last_claim: bool, timeout: int) -> dict[str, Any]:
    """One in-memory run of ``path`` with claims recorded to ``record``, up to cell ``upto`` (None: to the last claim
    cell with ``upto_last_claim``, else to the end): seconds, cells run, the error if any."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    if upto is not None or upto_last_claim:
        nb.cells = nb.cells[:(last_claim_cell(nb.cells) if upto is None else upto) + 1]
    os.environ.update({**quiet_environ(), "COURSE_CLAIMS": f"{RECORD_PREFIX}{record}"})  # the kernel inherits it
    start, error = time.perf_counter(), None
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:  # the next run goes on
        error = str(exc).strip().splitlines()[-1][:300]
    return {"seconds": round(time.perf_counter() - start, 1), "cells": len(nb.cells), "error": error,
            "claims": read_records(record)}


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per claim (by id, in the order first seen): its statement, how often it held, and min/median/max of each
    value that was a number in every run that recorded it."""
    rows: dict[str, dict[str, Any]] = {}
    for run in runs:
        for rec in run["claims"]:
            row = rows.setdefault(rec["id"], {"id": rec["id"], "statement": rec["statement"], "held": 0, "n": 0,
                                              "values": {}})
            row["held"] += bool(rec["holds"])
            row["n"] += 1
            for key, value in rec.get("values", {}).items():
                row["values"].setdefault(key, []).append(value)
    for row in rows.values():
        row["values"] = {key: {"min": min(vs), "median": statistics.median(vs), "max": max(vs)}
                         for key, vs in row["values"].items()
                         if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vs)}
    return list(rows.values())


def _spread(values: dict[str, dict[str, float]]) -> str:
    return ", ".join(f"{k} {v['min']:.3g}/{v['median']:.3g}/{v['max']:.3g}" for k, v in values.items())


def table(results: dict[str, dict[str, Any]]) -> str:
    """The claims of every notebook (``08b 卷积和矩阵乘…``): held k/N and min/median/max of their numbers."""
    rows = []
    for name, result in results.items():
        for row in result["claims"]:
            statement = row["statement"] if len(row["statement"]) <= SHOWN else row["statement"][:SHOWN - 1] + "…"
            rows.append([f"{name.split('_')[0]} {statement}", f"{row['held']}/{row['n']}", _spread(row["values"])])
    return format_table(rows, ["notebook and claim", "held", "values min/median/max"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebooks", nargs="*", default=DEFAULT, help=f"name prefixes (default: {' '.join(DEFAULT)})")
    p.add_argument("--repeats", type=int, default=10, help="runs of each notebook (default 10)")
    p.add_argument("--hogs", type=int, default=4, help="busy loops beside the runs (default 4)")
    p.add_argument("--upto-last-claim", action=argparse.BooleanOptionalAction, default=True,
                   help="stop each notebook after its last cell that calls claim( (the default)")
    p.add_argument("--timeout", type=int, default=600, help="seconds a cell may take (default 600)")
    args = p.parse_args(argv)
    paths = notebooks(args.notebooks)
    info = machine_info()
    print(header(info), flush=True)
    loads: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(5.0):
            loads.append(os.getloadavg()[0])

    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="claims_") as tmp, cpu_hogs(args.hogs):
        time.sleep(10 if args.hogs else 0)  # let the 1-minute load average climb before the first run
        threading.Thread(target=sample, daemon=True).start()
        for path, cell in paths:
            runs = []
            for k in range(args.repeats):
                run = execute(path, Path(tmp) / f"{path.stem}.{k}.jsonl", cell, args.upto_last_claim, args.timeout)
                runs.append(run)
                print(f"{path.stem} run {k + 1}/{args.repeats}: {run['seconds']} s, {len(run['claims'])} claims"
                      + (f", error: {run['error']}" if run["error"] else ""), flush=True)
            results[path.stem] = {"runs": runs, "claims": summarize(runs)}
        stop.set()
    load = {"min": min(loads, default=None), "median": statistics.median(loads) if loads else None,
            "max": max(loads, default=None), "samples": len(loads)}
    print(f"\n{args.hogs} hogs, {args.repeats} runs per notebook; 1-minute load average: min {load['min']}, "
          f"median {load['median']}, max {load['max']} ({load['samples']} samples)")
    for name, result in results.items():
        seconds = [r["seconds"] for r in result["runs"]]
        errors = sum(r["error"] is not None for r in result["runs"])
        print(f"  {name}: {result['runs'][0]['cells']} cells, {min(seconds)}-{max(seconds)} s per run"
              + (f", {errors} runs ended in an error" if errors else ""))
    print("\n" + table(results))
    out = write_json("claims_under_load", {"machine": info, "hogs": args.hogs, "repeats": args.repeats,
                                           "upto_last_claim": args.upto_last_claim, "load_1min": load,
                                           "notebooks": results})
    print(f"\nwrote {out.relative_to(REPO)}")
    return 1 if any(r["error"] for result in results.values() for r in result["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
