"""Side by side: the resume doctor on four training stacks, each written as its users write it.

- ``lightning``: stock PyTorch Lightning (pinned in bench/requirements.txt): a ``LightningModule``, a shuffled
  ``DataLoader`` with 2 worker processes, the default end-of-epoch ``ModelCheckpoint(save_last=True)`` and
  ``fit(ckpt_path=last)`` to resume (``bench/doctor_peer_scripts/lightning_run.py``);
- ``accelerate``: Hugging Face Accelerate (pinned there too): ``prepare``, ``save_state`` every step, on resume
  ``load_state`` and ``skip_first_batches`` (``accelerate_run.py``); ``accelerate seedable``: the same with the
  option its docs give for reproducible shuffling, ``use_seedable_sampler=True``;
- ``nanogpt``: a bare loop in nanoGPT's style, written here: random windows from the global generator, a
  checkpoint of model, optimizer and ``iter_num`` after each evaluation (``nanogpt_run.py``);
- ``pro``: the course's professional script, ``solutions/homework/train_cifar_pro.py``, with 04's small flags.

The first three train 13's tiny causal LM (``course_tools/lab/train_tiny_lm.py``) for 24 optimizer steps (3 epochs
of 8 batches). Each runs through ``python -m course_utils.resume_doctor --steps N -- CMD`` (its command-line
contract and JSON report only): the doctor runs the command uninterrupted and killed after exact optimizer steps
(mid-epoch, after the first epoch end, twice in one chain), resumes it and names the first state that differs.
The table gives, per stack, whether every resume was exact and, if not, the doctor's first finding (component,
step, its cause key). It is a measurement: the verdicts are whatever the doctor found in this run.

    pip install -r bench/requirements.txt
    python bench/doctor_peers.py                  # a few minutes on 2 CPU cores
    python bench/doctor_peers.py --only nanogpt
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PRO_SCRIPT, format_table, header, machine_info, write_json  # noqa: E402

from course_tools.noninteractive import quiet_environ  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent / "doctor_peer_scripts"
LM_STEPS = 24
PRO_STEPS = 30
PRO_FLAGS = ["--model", "tiny", "--width", "8", "--batch-size", "32", "--epochs", "100", "--data-fraction", "0.1",
             "--max-steps", str(PRO_STEPS), "--ckpt-every-steps", "5", "--log-every", "5", "--no-progress",
             "--workers", "0", "--device", "cpu"]

# stack -> (optimizer steps of an uninterrupted run, the training command with {out} and the resume argument)
STACKS: dict[str, tuple[int, list[str]]] = {
    "lightning": (LM_STEPS, [str(SCRIPTS / "lightning_run.py"), "--out", "{out}", "[--resume]"]),
    "accelerate": (LM_STEPS, [str(SCRIPTS / "accelerate_run.py"), "--out", "{out}", "[--resume]"]),
    "accelerate seedable": (LM_STEPS, [str(SCRIPTS / "accelerate_run.py"), "--out", "{out}", "--seedable-sampler",
                                       "[--resume]"]),
    "nanogpt": (LM_STEPS, [str(SCRIPTS / "nanogpt_run.py"), "--out", "{out}", "[--resume]"]),
    "pro": (PRO_STEPS, [str(PRO_SCRIPT), "--out", "{out}", *PRO_FLAGS, "[--resume]"]),
}


def _children_cpu() -> float:
    """CPU seconds (user + system) of every finished child process and its descendants so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def examine(stack: str, folder: Path) -> dict:
    """One doctor run on ``stack``: its exit status, seconds, and the report's verdict and first finding."""
    steps, command = STACKS[stack]
    report = folder / "report.json"
    doctor = [sys.executable, "-m", "course_utils.resume_doctor", "--steps", str(steps), "--workdir", str(folder),
              "--report", str(report), "--", sys.executable, *command]
    start, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run(doctor, capture_output=True, text=True, env={**os.environ, **quiet_environ()})
    seconds, cpu = time.perf_counter() - start, _children_cpu() - cpu
    data = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else {}
    first = data.get("first") or {}
    return {"stack": stack, "exit": done.returncode, "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
            "verdict": data.get("verdict", "?"),
            "component": first.get("component", ""), "step": first.get("step", ""), "cause": first.get("cause", ""),
            "what": first.get("what", ""), "error": data.get("error", "") or ("" if data else done.stderr[-800:]),
            "chains": {name: [c.get("kills"), (c.get("finding") or {}).get("component")]
                       for name, c in data.get("chains", {}).items()},
            "diagnosis": done.stdout.strip()}


def table(rows: list[dict]) -> str:
    shown = [(r["stack"], {0: "exact", 1: "differs"}.get(r["exit"], f"error ({r['exit']})"),
              r["component"] or "-", r["step"] if r["step"] != "" else "-", r["cause"] or "-", r["seconds"],
              r["cpu_seconds"]) for r in rows]
    return format_table(shown, ["stack", "resume", "first difference", "at step", "cause", "wall s", "CPU s"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", choices=list(STACKS), default=list(STACKS))
    p.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/doctor_peers.json)")
    args = p.parse_args(argv)
    info = machine_info()
    print(header(info))
    rows = []
    with tempfile.TemporaryDirectory(prefix="doctor_peers_") as tmp:
        for stack in args.only:
            row = examine(stack, Path(tmp) / stack.replace(" ", "_"))
            print(f"--- {stack}: exit {row['exit']} in {row['seconds']} s\n{row['diagnosis']}", flush=True)
            rows.append(row)
    text = table(rows) + (f"\n\n{len(rows)} doctor runs: {sum(r['seconds'] for r in rows):.0f} s wall, "
                          f"{sum(r['cpu_seconds'] for r in rows):.0f} CPU s")
    print(text)
    path = write_json("doctor_peers", {"machine": info, "rows": rows, "table": text}, args.out)
    print(f"wrote {path}")
    return 0 if all(r["exit"] in (0, 1) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
