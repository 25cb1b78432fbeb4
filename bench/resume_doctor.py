"""The resume doctor against its zoo: every bug caught, the right component and first step, no false alarm.

Runs ``python -m course_utils.resume_doctor`` (a real command line, as a learner runs it) on each script of
``bench/resume_zoo/`` (one upstream resume bug each, written here as a one-method change of the zoo's tiny
correct run) and on the controls: the zoo's correct run, the homework's reference answer
(``solutions/homework/train_cifar.py``), the professional script and, when torchdata is installed, a run
whose data position comes from ``StatefulDataLoader``. ``--repeats`` runs of each; then ``--hog-repeats``
more beside ``--hogs`` CPU hogs (the kills count optimizer steps, so the verdicts must not move). Each
bug's expected component and first differing step are written next to it below, from the bug's design
and the doctor's kill plan (an epoch of 12 steps: kills after 7; 13; 5 and 12 more).

    python bench/resume_doctor.py                          # 5 quiet runs of each, 1 beside 4 hogs
    python bench/resume_doctor.py --repeats 1 --only no_ema correct
    python bench/resume_doctor.py --repeats 0 --hog-repeats 1 --only correct --merge   # add runs beside hogs
    python bench/resume_doctor.py --repeats 1 --hog-repeats 0 --only no_grad_scaler --json /tmp/trial.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import REPO, format_table, header, machine_info, write_json  # noqa: E402
from course_tools.cputime import cpu_hogs  # noqa: E402
from course_utils.data import default_data_root  # noqa: E402

ZOO = REPO / "bench" / "resume_zoo"
HOMEWORK = REPO / "solutions" / "homework"
RESUME = "[--resume]"
RESULT = REPO / "bench" / "results" / "resume_doctor.json"

# script: (upstream bug, expected component, expected first differing step)
BUGS = {
    "minimind_fp16": ("MiniMind: weights saved as v.half()", "weights", 4),
    "minimind_no_rng": ("MiniMind: no RNG state in the resume file", "rng", 4),
    "swift_reseed": ("ms-swift PR #9935: global RNG re-seeded after restore", "rng", 4),
    "eval_after_save": ("eval-after-save slip (global generator drawn)", "rng", 13),
    "no_scheduler": ("missing scheduler", "scheduler", 5),
    "no_ema": ("missing EMA", "ema", 4),
    "no_grad_scaler": ("missing GradScaler state", "grad_scaler", 4),
    "no_optimizer": ("missing optimizer state", "optimizer", 4),
    "one_step_early": ("resuming one step early", "step_counter", 4),
    "split_accumulation": ("split accumulation window", "accumulation", 1),
    "lightning_21938": ("Lightning #21938: epoch 0 replayed, num_workers > 0", "data", 13),
    "accelerate_4195": ("Accelerate #4195: cursor restored, not the shuffle order", "data", 13),
    "accelerate_4233": ("Accelerate PR #4233: next epoch's generator saved mid-epoch", "data", 4),
    "verl_7401": ("verl #7401: an epoch skipped at an epoch-boundary resume", "data", 13),
    "prime_rl_3332": ("prime-rl PR #3332: iter() before load_state_dict", "data", 4),
    "swift_10050": ("ms-swift #10050: the rebuilt sampler replays epoch 0", "data", 13),
    "torchdata_generator": ("found here: StatefulDataLoader with its own generator", "data", 13),
    "torchdata_global": ("found here: StatefulDataLoader drawing from the global generator", "rng", 4),
}
ZOO_STEPS = {"split_accumulation": 12}  # 3 micro-batches a step: 4 steps an epoch
HOMEWORK_ARGS = ["--seed", "1234", "--max-steps", "40", "--ckpt-every-steps", "4", "--dropout", "0.5", "--model", "tiny",
                 "--data-fraction", "0.1", "--batch-size", "32", "--epochs", "1000"]
PRO_ARGS = ["--model", "tiny", "--width", "8", "--data-fraction", "0.1", "--batch-size", "32", "--warmup-steps", "5",
            "--lr", "3e-3", "--no-progress", "--epochs", "2", "--ckpt-every-steps", "4", "--log-every", "3"]


def commands(torchdata: bool) -> dict[str, tuple[int, list[str]]]:
    """name -> (--steps, CMD) for every zoo script and control."""
    py = sys.executable
    found = {name: (ZOO_STEPS.get(name, 36), [py, str(ZOO / f"{name}.py"), "--steps", str(ZOO_STEPS.get(name, 36)),
                                              "--out", "{out}", RESUME]) for name in BUGS}
    found["correct"] = (36, [py, str(ZOO / "correct.py"), "--out", "{out}", RESUME])
    found["train_cifar"] = (40, [py, str(HOMEWORK / "train_cifar.py"), "--out", "{out}", *HOMEWORK_ARGS, RESUME])
    found["train_cifar_pro"] = (30, [py, str(HOMEWORK / "train_cifar_pro.py"), "--out", "{out}", *PRO_ARGS, RESUME])
    if not torchdata:
        del found["torchdata_generator"], found["torchdata_global"]
    else:
        found["stateful_loader"] = (36, [py, str(ZOO / "stateful_loader.py"), "--out", "{out}", RESUME])
    return found


def doctor(steps: int, cmd: list[str], env: dict[str, str]) -> dict:
    """One run of the doctor's command line: its report, exit code and wall time."""
    with tempfile.TemporaryDirectory(prefix="rd_bench_") as tmp:
        start = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "course_utils.resume_doctor", "--steps", str(steps), "--workdir", tmp,
                              "--lang", "en", "--", *cmd], capture_output=True, text=True, env=env, cwd=REPO)
        wall = time.monotonic() - start
        path = Path(tmp) / "report.json"
        report = json.loads(path.read_text()) if path.exists() else {}
    first = report.get("first") or {}
    return {"exit": out.returncode, "seconds": round(wall, 1), "component": first.get("component"),
            "cause": first.get("cause"), "step": first.get("step"), "chain": first.get("chain"),
            "error": report.get("error") or (out.stderr[-300:] if out.returncode == 2 else None)}


def run_all(names: list[str], cmds: dict, repeats: int, env: dict[str, str]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for _ in range(repeats):
        for name in names:
            got = doctor(*cmds[name], env)
            runs.setdefault(name, []).append(got)
            print(f"  {name}: exit {got['exit']} {got['component']}/{got['cause']} step {got['step']} "
                  f"({got['seconds']} s)", flush=True)
    return runs


def table(cmds: dict, quiet: dict, hogs: dict, n_hogs: int) -> tuple[str, list[dict]]:
    rows, out = [], []
    for name in cmds:
        q, h = quiet.get(name, []), hogs.get(name, [])
        every = q + h
        bug = BUGS.get(name)
        caught = sum(r["exit"] == 1 for r in every)
        right = sum(bug is not None and r["component"] == bug[1] for r in every)
        first = sum(bug is not None and r["step"] == bug[2] for r in every)
        t_q = max((r["seconds"] for r in q), default=None)
        t_h = max((r["seconds"] for r in h), default=None)
        row = {"name": name, "upstream": bug[0] if bug else "control", "runs": len(every), "caught": caught,
               "component_right": right, "step_right": first, "false_alarms": 0 if bug else sum(r["exit"] != 0 for r in every),
               "found": sorted({f"{r['component']}@{r['step']}" for r in every if r["component"]}),
               "max_s_quiet": t_q, "max_s_hogs": t_h}
        out.append(row)
        verdict = (f"{caught}/{len(every)}", f"{right}/{len(every)}", f"{first}/{len(every)}") if bug else \
            (f"{row['false_alarms']} alarms / {len(every)}", "-", "-")
        rows.append([name, row["upstream"], *verdict, ", ".join(row["found"]) or "exact", t_q, t_h])
    return format_table(rows, ["script", "upstream bug", "caught", "component right", "first step right",
                               "doctor found", "max s quiet", f"max s beside {n_hogs} hogs"]), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hog-repeats", type=int, default=1)
    p.add_argument("--hogs", type=int, default=4)
    p.add_argument("--only", nargs="*")
    p.add_argument("--merge", action="store_true", help="add to the runs recorded in bench/results/resume_doctor.json")
    p.add_argument("--json", type=Path, default=RESULT, help="where the results go (default: %(default)s; a trial run "
                                                              "elsewhere leaves the recorded results alone)")
    args = p.parse_args()
    info = machine_info()
    try:
        import torchdata  # noqa: F401
        has_torchdata = True
    except ImportError:
        has_torchdata = False
    cmds = commands(has_torchdata)
    names = [n for n in cmds if not args.only or n in args.only]
    env = {**os.environ, "COURSE_FAST": "1", "COURSE_DATA": str(default_data_root() / "checks")}
    quiet = run_all(names, cmds, args.repeats, env)
    hogs = {}
    if args.hog_repeats > 0:  # no hogs started for nothing
        with cpu_hogs(args.hogs):
            hogs = run_all(names, cmds, args.hog_repeats, env)
    if args.merge and RESULT.exists():  # add these runs to the recorded ones (a long bench done in parts)
        before = json.loads(RESULT.read_text())["runs"]
        quiet, hogs = ({n: before[kind].get(n, []) + new.get(n, []) for n in cmds if before[kind].get(n) or new.get(n)}
                       for kind, new in (("quiet", quiet), ("hogs", hogs)))
        names = [n for n in cmds if n in quiet or n in hogs]
    text, rows = table({n: cmds[n] for n in names}, quiet, hogs, args.hogs)
    print(header(info))
    print(text)
    write_json("resume_doctor", {"machine": info, "table": text, "rows": rows, "hogs": args.hogs, "torchdata": has_torchdata,
                                 "repeats": args.repeats, "hog_repeats": args.hog_repeats, "merged": args.merge,
                                 "runs": {"quiet": quiet, "hogs": hogs}}, args.json)


if __name__ == "__main__":
    main()
