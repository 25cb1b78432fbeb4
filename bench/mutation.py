"""Mutation check of three exercise checks: weaken one, and its exercise tests must fail (issue 31).

Each mutant is one textual edit of a check in ``course_tools/checks`` (asserted to apply exactly once),
made in a scratch git worktree of HEAD (the working tree is never touched); that notebook's exercise
tests then run there (``pytest -m "not slow"``, one process). A mutant the tests do not catch is a
guarantee the suite does not hold. Exit status 1 when any mutant survives.

- nb02 ``check_global_clip``: the check returns after its first case (three of its four cases unread);
- nb03 ``check_ema_update``: its reference (``AveragedModel``) is updated twice per step (a broken reference);
- nb07 ``check_batch_mixing``: the comparison ignores samples the reference finds only faintly mixed
  (a tolerance of 1e-3 on the gradient, the mistake the faint-leak case is there to catch).

    python bench/mutation.py        # ~1 minute
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, format_table, header, machine_info, write_json  # noqa: E402

MUTANTS = [  # (name, file, the text, its replacement, the exercise tests)
    ("nb02 check_global_clip returns after its first case", "course_tools/checks/nb02_grad_clipping.py",
     "        weights = [p.detach().clone() for p in params]\n",
     "        weights = [p.detach().clone() for p in params]\n        if n != _CASES[0][0]:\n            return\n",
     "tests/test_nb02_grad_clipping.py"),
    ("nb03 check_ema_update's reference updated twice", "course_tools/checks/nb03_ema.py",
     "        reference.update_parameters(model)\n",
     "        reference.update_parameters(model)\n        reference.update_parameters(model)\n",
     "tests/test_nb03_ema.py"),
    ("nb07 check_batch_mixing blind to faint mixing", "course_tools/checks/nb07_single_batch_overfit.py",
     "        expected = reference_mixing(model, x, i)\n",
     "        expected = reference_mixing(model, x, i)\n"
     "        expected = {j for j in expected if case != 'faint'}\n",
     "tests/test_nb07_batch_mixing.py"),
]


def run_mutant(tree: Path, file: str, old: str, new: str, tests: str) -> tuple[int, str]:
    """(pytest's exit code, its summary line) with the mutation applied in ``tree``; the file restored after."""
    path = tree / file
    original = path.read_text(encoding="utf-8")
    assert original.count(old) == 1, f"{file}: the mutation's text must appear exactly once"
    path.write_text(original.replace(old, new), encoding="utf-8")
    try:
        env = {**os.environ, "PYTHONPATH": str(tree)}  # before the editable install of the working tree
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-m",
                               "not slow", tests], cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    finally:
        path.write_text(original, encoding="utf-8")
    summary = [line for line in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    return proc.returncode, summary[-1].strip("= ") if summary else proc.stdout[-300:]


def main() -> int:
    print(header(machine_info("cpu")))
    rows, survivors = [], 0
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), "HEAD"], cwd=REPO, check=True)
        try:
            for name, file, old, new, tests in MUTANTS:
                unmutated = run_mutant(tree, file, old, old, tests)
                code, summary = run_mutant(tree, file, old, new, tests)
                caught = unmutated[0] == 0 and code != 0
                survivors += not caught
                rows.append([name, tests, unmutated[1], summary, "caught" if caught else "SURVIVED"])
                print(f"{name}: {summary}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=True)
    text = format_table(rows, ["mutant", "tests", "unmutated", "mutated", "verdict"])
    print()
    print(text)
    path = write_json("mutation", {"rows": rows, "survivors": survivors, "table": text})
    print(f"\nJSON: {path}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
