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

    python bench/resume_cost.py
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, format_table, header, machine_info, spread, write_json  # noqa: E402

from course_tools.noninteractive import quiet_environ  # noqa: E402

SCRIPT = REPO / "solutions" / "homework" / "train_cifar_pro.py"


def run_until_step(args: list[str], out: Path, target_step: int, env: dict, timeout: float = 600) -> dict:
    """Start the script; return seconds until ``target_step`` is in metrics.jsonl and until exit."""
    metrics = out / "metrics.jsonl"
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--out", str(out), *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = None
    while proc.poll() is None and time.perf_counter() - start < timeout:
        if first is None and metrics.exists():
            try:
                lines = metrics.read_text(encoding="utf-8").splitlines()
            except OSError:
                lines = []
            for line in reversed(lines):
                try:
                    if json.loads(line).get("step", 0) >= target_step:
                        first = time.perf_counter() - start
                        break
                except json.JSONDecodeError:
                    continue
        time.sleep(0.01)
    output, _ = proc.communicate(timeout=max(1.0, timeout - (time.perf_counter() - start)))
    total = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"train_cifar_pro.py {' '.join(args)} exited {proc.returncode}:\n{output[-2000:]}")
    return {"first_step_s": first if first is not None else total, "exit_s": total, "output": output[-2000:]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ckpt-step", type=int, default=10, help="C: the checkpoint step the resumed runs start from")
    p.add_argument("--model", choices=["small", "tiny"], default="small")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS for the runs (0: leave unset)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    env = {**quiet_environ(override=True), "PYTHONUNBUFFERED": "1"}
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    import torch  # for machine info only
    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine_info(torch.device(args.device))
    print(header(info))
    common = ["--model", args.model, "--batch-size", "32", "--data-fraction", "0.2", "--log-every", "1",
              "--ckpt-every-steps", str(args.ckpt_step), "--no-progress", "--device", args.device, "--amp", "off"]
    c = args.ckpt_step
    rows = {"python -c 'import torch'": [], "fresh start": [], "resume": []}
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        tmp = Path(tmp)
        base = tmp / "base"
        run_until_step([*common, "--max-steps", str(c)], base, c, env)
        assert any(base.glob("checkpoints/step_*.pt")), "setup run left no checkpoint"
        for r in range(args.repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import torch"], env=env, check=True)
            rows["python -c 'import torch'"].append({"first_step_s": float("nan"), "exit_s": time.perf_counter() - t0})
            order = ("fresh", "resume") if r % 2 == 0 else ("resume", "fresh")
            for which in order:
                if which == "fresh":
                    res = run_until_step([*common, "--max-steps", "1"], tmp / f"fresh{r}", 1, env)
                    rows["fresh start"].append(res)
                else:
                    folder = tmp / f"resume{r}"
                    shutil.copytree(base, folder)
                    # one more step than the setup run: a new horizon, allowed explicitly (it re-times the schedule)
                    res = run_until_step([*common, "--max-steps", str(c + 1), "--resume", "--allow-change", "max_steps"],
                                         folder, c + 1, env)
                    assert "续训" in res["output"], res["output"]
                    rows["resume"].append(res)
            print(f"  repeat {r + 1}/{args.repeats}: fresh first step {rows['fresh start'][-1]['first_step_s']:.2f}s, "
                  f"resume first step {rows['resume'][-1]['first_step_s']:.2f}s")
    summary = {k: {"first_step_s": spread([x["first_step_s"] for x in v]), "exit_s": spread([x["exit_s"] for x in v])}
               for k, v in rows.items()}
    table_rows = []
    for k, v in summary.items():
        f, e = v["first_step_s"], v["exit_s"]
        first = "-" if f["median"] != f["median"] else f"{f['median']:.2f} ({f['min']:.2f}-{f['max']:.2f})"
        table_rows.append([k, first, f"{e['median']:.2f} ({e['min']:.2f}-{e['max']:.2f})"])
    d_first = summary["resume"]["first_step_s"]["median"] - summary["fresh start"]["first_step_s"]["median"]
    d_exit = summary["resume"]["exit_s"]["median"] - summary["fresh start"]["exit_s"]["median"]
    text = (f"train_cifar_pro.py, {args.model} model, COURSE_FAST=1, batch 32, resumed from step {c} "
            f"(mid-epoch), {args.repeats} alternating repeats\n\n"
            + format_table(table_rows, ["seconds from process start (median, min-max)", "to first step", "to exit"])
            + f"\n\nresume - fresh: {d_first:+.2f} s to the first step, {d_exit:+.2f} s to exit")
    print()
    print(text)
    path = write_json("resume_cost", {"machine": info, "summary": summary, "resume_minus_fresh_first_step_s": d_first,
                                      "resume_minus_fresh_exit_s": d_exit,
                                      "runs": {k: [{kk: vv for kk, vv in x.items() if kk != "output"} for x in v]
                                               for k, v in rows.items()}, "table": text}, args.json)
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
