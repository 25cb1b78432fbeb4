"""Resume cost: seconds from process start to the first optimizer step, resumed against fresh.

Runs solutions/homework/train_cifar_pro.py as subprocesses (COURSE_FAST=1 data, SmallCNN,
batch 32, --log-every 1 so every step's metrics record is written at once):

- setup: one fresh run of ``--max-steps C`` leaves a checkpoint at step C (mid-epoch);
- fresh:   a new folder, ``--max-steps 1``;
- resumed: a copy of the setup folder, ``--resume --max-steps C+1``.

Both then do exactly one optimizer step, the final evaluation and the final save, so
the difference of their times is the cost of resuming (finding, checksumming and
loading the checkpoint, restoring the state, trimming metrics.jsonl). "first step" is
when the step's record appears in metrics.jsonl (polled every 10 ms); "exit" is the
process's whole wall time. The scripts are not modified. Repeats alternate fresh/resumed.

The restart tax R of a preemption (``course_utils.estimate_ckpt``) is the resumed run's time to its first step
less one step. Its parts are timed in a fresh interpreter that does what a resume does, one part after the
other: the interpreter with ``import torch`` (the ``python -c 'import torch'`` row), the data, the model and
its optimizer built (the first optimizer imports torch._dynamo), the checkpoint loaded and restored, the warm-up
(the first ``train_step``'s excess over the median of the next five, which is also the step time reported);
the rest is the script's own start-up (flags, run folder, config, the peak-FLOP/s probe, the monitor). The homework's reference answer (solutions/homework/train_cifar.py)
is timed the same way; its "first step" is the loss line it prints for the first batch of an epoch.

    python bench/resume_cost.py
    python bench/resume_cost.py --model tiny --width 8 --data-fraction 0.768 --json /tmp/r.json  # bench/preemption.py's run
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, format_table, header, load_pro_script, machine_info, spread, write_json  # noqa: E402

from course_tools.noninteractive import quiet_environ  # noqa: E402

SCRIPT = REPO / "solutions" / "homework" / "train_cifar_pro.py"
HOMEWORK = REPO / "solutions" / "homework" / "train_cifar.py"


def run_until(args: list[str], out: Path, first_step: Callable[[Path, str], bool], env: dict,
              script: Path = SCRIPT, timeout: float = 600) -> dict:
    """Start ``script``; seconds until ``first_step(out, output so far)`` holds (polled every 10 ms) and until exit."""
    start = time.perf_counter()
    log = out.parent / f"{out.name}.log"
    with open(log, "w", encoding="utf-8") as sink:
        proc = subprocess.Popen([sys.executable, str(script), "--out", str(out), *args], env=env, cwd=REPO,
                                stdout=sink, stderr=subprocess.STDOUT, text=True)
        first = None
        while proc.poll() is None and time.perf_counter() - start < timeout:
            if first is None and first_step(out, log.read_text(encoding="utf-8", errors="replace")):
                first = time.perf_counter() - start
            time.sleep(0.01)
        proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - start)))
    total, output = time.perf_counter() - start, log.read_text(encoding="utf-8", errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{script.name} {' '.join(args)} exited {proc.returncode}:\n{output[-2000:]}")
    return {"first_step_s": first if first is not None else total, "exit_s": total, "output": output[-2000:]}


def step_logged(target_step: int) -> Callable[[Path, str], bool]:
    """The professional script: ``target_step``'s record is in metrics.jsonl (--log-every 1)."""
    def done(out: Path, _output: str) -> bool:
        try:
            lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        except OSError:
            return False
        for line in reversed(lines):
            try:
                if json.loads(line).get("step", 0) >= target_step:
                    return True
            except json.JSONDecodeError:
                continue
        return False
    return done


def homework_step(_out: Path, output: str) -> bool:
    """The homework's reference answer prints the loss of the first batch of every (resumed) epoch."""
    return re.search(r"^epoch \d+ step 0 loss", output, re.M) is not None


def parts_child(args: argparse.Namespace) -> int:
    """In this fresh process, time what a resume does, one part after the other; prints one JSON line.

    import torch; the data (train and test sets, as the script builds them); the model and optimizer built (the
    first optimizer imports torch._dynamo, seconds that a fresh start pays too); the schedule and EMA built and the
    newest checkpoint of ``--path`` loaded (checksum) and restored; the first training step (the
    script's ``train_step``) against the median of the next five: its excess is the warm-up.
    """
    times, start = {}, time.perf_counter()
    import torch
    times["import torch"] = time.perf_counter() - start
    from course_utils.checkpoint import CheckpointManager, restore_training_state
    from course_utils.data import load_cifar10, make_loader, take_fraction
    from course_utils.ema import EMA
    from course_utils.models import build_model
    from course_utils.schedule import make_scheduler
    torch.set_num_threads(args.threads or torch.get_num_threads())
    start = time.perf_counter()
    train = take_fraction(load_cifar10(True, augment=True, seed=0, quiet=True), args.data_fraction)
    take_fraction(load_cifar10(False, quiet=True), args.data_fraction)
    times["data"] = time.perf_counter() - start
    start = time.perf_counter()
    model = build_model(args.model, width=args.width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the first optimizer imports torch._dynamo
    times["model + optimizer built"] = time.perf_counter() - start
    start = time.perf_counter()
    scheduler, ema = make_scheduler(optimizer, 5, 1000), EMA(model, decay=0.999, warmup=True)
    found = CheckpointManager(Path(args.path) / "checkpoints").load_latest()
    restore_training_state(found.state, model=model, optimizer=optimizer, scheduler=scheduler, ema=ema,
                           restore_rng=False)
    times["checkpoint load"] = time.perf_counter() - start
    pro = load_pro_script()
    batches = iter(make_loader(train, args.batch_size, seed=0, epoch=1))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    steps = []
    for _ in range(6):
        x, y = next(batches)
        start = time.perf_counter()
        pro.train_step(model, x, y, optimizer=optimizer, scheduler=scheduler, scaler=scaler, ema=ema,
                       device=torch.device("cpu"), amp_dtype=None, clip=1.0)
        steps.append(time.perf_counter() - start)
    times["warm-up"] = steps[0] - statistics.median(steps[1:])
    print(json.dumps({"parts": times, "step_s": statistics.median(steps[1:])}))
    return 0


def restart_parts(folder: Path, args: argparse.Namespace, env: dict) -> dict:
    """Run ``parts_child`` in a fresh interpreter on the checkpoint in ``folder``."""
    command = [sys.executable, __file__, "--child-parts", "--path", str(folder), "--model", args.model,
               "--width", str(args.width), "--data-fraction", str(args.data_fraction), "--threads", str(args.threads),
               "--batch-size", str(args.batch_size)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"parts child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, env: dict, log: Callable[[str], None] = print) -> dict:
    """Seconds from process start to the first step, fresh and resumed (alternating), for the professional
    script and (``args.homework``) the homework's reference answer; R's parts in a fresh interpreter.

    Each resumed run continues a copy of a setup run's folder (a checkpoint at step ``ckpt_step``, mid-epoch) for
    one more step. Returns {"rows": {row: [runs]}, "parts": [R's parts per repeat], "step_s": [...]}.
    """
    c = args.ckpt_step
    common = ["--model", args.model, "--width", str(args.width), "--batch-size", str(args.batch_size), "--data-fraction",
              str(args.data_fraction), "--log-every", "1", "--ckpt-every-steps", str(c), "--ckpt-every-seconds", "0",
              "--no-progress", "--device", args.device, "--amp", "off"]
    homework = ["--model", args.model, "--batch-size", str(args.batch_size), "--data-fraction", str(args.data_fraction),
                "--ckpt-every-steps", str(c)]
    rows: dict[str, list[dict]] = {"python -c 'import torch'": [], "fresh start": [], "resume": []}
    if args.homework:
        rows |= {"homework: fresh start": [], "homework: resume": []}
    parts, step_s = [], []
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        tmp = Path(tmp)
        run_until([*common, "--max-steps", str(c)], tmp / "base", step_logged(c), env)
        assert any((tmp / "base").glob("checkpoints/step_*.pt")), "setup run left no checkpoint"
        if args.homework:
            run_until([*homework, "--max-steps", str(c)], tmp / "hw_base", homework_step, env, script=HOMEWORK)
        for r in range(args.repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import torch"], env=env, check=True)
            rows["python -c 'import torch'"].append({"first_step_s": float("nan"), "exit_s": time.perf_counter() - t0})
            for which in (("fresh", "resume") if r % 2 == 0 else ("resume", "fresh")):
                if which == "fresh":
                    rows["fresh start"].append(run_until([*common, "--max-steps", "1"], tmp / f"fresh{r}",
                                                         step_logged(1), env))
                    if args.homework:
                        rows["homework: fresh start"].append(run_until(
                            [*homework, "--max-steps", "1"], tmp / f"hw_fresh{r}", homework_step, env, script=HOMEWORK))
                    continue
                shutil.copytree(tmp / "base", tmp / f"resume{r}")
                # one more step than the setup run: a new horizon, allowed explicitly (it re-times the schedule)
                res = run_until([*common, "--max-steps", str(c + 1), "--resume", "--allow-change", "max_steps"],
                                tmp / f"resume{r}", step_logged(c + 1), env)
                assert "续训" in res["output"], res["output"]
                rows["resume"].append(res)
                if args.homework:
                    shutil.copytree(tmp / "hw_base", tmp / f"hw_resume{r}")
                    res = run_until([*homework, "--max-steps", str(c + 1), "--resume"], tmp / f"hw_resume{r}",
                                    homework_step, env, script=HOMEWORK)
                    assert "resuming from" in res["output"], res["output"]
                    rows["homework: resume"].append(res)
            measured = restart_parts(tmp / "base", args, env)
            parts.append(measured["parts"])
            step_s.append(measured["step_s"])
            log(f"  repeat {r + 1}/{args.repeats}: fresh first step {rows['fresh start'][-1]['first_step_s']:.2f}s, "
                f"resume first step {rows['resume'][-1]['first_step_s']:.2f}s")
    return {"rows": {k: [{kk: vv for kk, vv in x.items() if kk != "output"} for x in v] for k, v in rows.items()},
            "parts": parts, "step_s": step_s}


def restart_tax(result: dict) -> dict[str, float]:
    """R and its parts (medians): the resumed run's seconds to its first step, split into the interpreter with
    ``import torch``, the data, the model and optimizer built, the checkpoint load, the warm-up and the rest (the
    script's own start-up)."""
    med = lambda xs: statistics.median(xs)  # noqa: E731
    parts = {"interpreter + import torch": med([x["exit_s"] for x in result["rows"]["python -c 'import torch'"]])}
    parts |= {name: med([p[name] for p in result["parts"]])
              for name in ("data", "model + optimizer built", "checkpoint load", "warm-up")}
    total = med([x["first_step_s"] for x in result["rows"]["resume"]]) - med(result["step_s"])
    return {"R": total, **parts, "rest (the script's own start-up)": total - sum(parts.values())}


def report(result: dict, args: argparse.Namespace) -> str:
    summary = {k: {"first_step_s": spread([x["first_step_s"] for x in v]), "exit_s": spread([x["exit_s"] for x in v])}
               for k, v in result["rows"].items()}
    table_rows = []
    for k, v in summary.items():
        f, e = v["first_step_s"], v["exit_s"]
        first = "-" if f["median"] != f["median"] else f"{f['median']:.2f} ({f['min']:.2f}-{f['max']:.2f})"
        table_rows.append([k, first, f"{e['median']:.2f} ({e['min']:.2f}-{e['max']:.2f})"])
    d_first = summary["resume"]["first_step_s"]["median"] - summary["fresh start"]["first_step_s"]["median"]
    d_exit = summary["resume"]["exit_s"]["median"] - summary["fresh start"]["exit_s"]["median"]
    tax = restart_tax(result)
    step = spread(result["step_s"])
    return (f"train_cifar_pro.py, {args.model} model (width {args.width}), COURSE_FAST=1, data fraction "
            f"{args.data_fraction}, batch {args.batch_size}, resumed from step {args.ckpt_step} (mid-epoch), {args.repeats} "
            "alternating repeats\n\n"
            + format_table(table_rows, ["seconds from process start (median, min-max)", "to first step", "to exit"])
            + f"\n\nresume - fresh: {d_first:+.2f} s to the first step, {d_exit:+.2f} s to exit\n\n"
            + "restart tax R (the resumed run's time to its first step, less one step) and its parts, medians\n"
            + format_table([[k, f"{v:.3f}"] for k, v in tax.items()], ["part", "seconds"])
            + f"\n\nstep time after the warm-up (train_step, median of 5 per repeat): {1e3 * step['median']:.1f} ms "
              f"({1e3 * step['min']:.1f}-{1e3 * step['max']:.1f})")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ckpt-step", type=int, default=10, help="C: the checkpoint step the resumed runs start from")
    p.add_argument("--model", choices=["small", "tiny"], default="small")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--data-fraction", type=float, default=0.2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--no-homework", dest="homework", action="store_false",
                   help="leave out the homework's reference answer (solutions/homework/train_cifar.py)")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS for the runs (0: leave unset)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None)
    p.add_argument("--child-parts", action="store_true", help=argparse.SUPPRESS)  # R's parts, in a fresh process
    p.add_argument("--path", default=None, help=argparse.SUPPRESS)
    return p


def bench_env(threads: int) -> dict:
    """The quiet environment of the runs, with ``threads`` OpenMP threads (0: unset)."""
    env = {**quiet_environ(override=True), "PYTHONUNBUFFERED": "1"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.child_parts:
        return parts_child(args)
    import torch  # for machine info only
    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine_info(torch.device(args.device))
    print(header(info))
    result = measure(args, bench_env(args.threads))
    text = report(result, args)
    print()
    print(text)
    path = write_json("resume_cost", {"machine": info, "restart_tax": restart_tax(result), **result, "table": text},
                      args.json)
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
