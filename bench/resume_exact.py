"""Kill-and-resume exactness: uninterrupted run against SIGKILL + --resume, per-step losses compared exactly.

Runs solutions/homework/train_cifar_pro.py twice with the same settings (COURSE_FAST=1
data, batch 32, 20% of the data so an epoch boundary is crossed, --log-every 1):
A uninterrupted; B killed with SIGKILL right after optimizer step ``--kill-after`` (a checkpoint
exists every ``--ckpt-every`` steps), then continued with ``--resume``. Every train
record's loss and grad norm must be bit-identical. Exit status 1 on any difference.

    python bench/resume_exact.py                                   # CPU
    python bench/resume_exact.py --device cuda --deterministic     # GPU (gpu_check.sh)
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, write_json  # noqa: E402

from course_utils import interrupt  # noqa: E402
from course_tools.noninteractive import quiet_environ  # noqa: E402

SCRIPT = REPO / "solutions" / "homework" / "train_cifar_pro.py"


def train_records(path: Path) -> dict[int, dict]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if r.get("split") == "train":
            out[r["step"]] = r
    return out


def last_step(path: Path) -> int:
    try:
        return max(train_records(path), default=0)
    except OSError:
        return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--amp", default="auto")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--kill-after", type=int, default=15)
    p.add_argument("--out", default=None, help="keep the run folders here (default: a temp folder)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    env = quiet_environ(override=True)
    common = ["--batch-size", "32", "--data-fraction", "0.2", "--log-every", "1", "--no-progress",
              "--max-steps", str(args.steps), "--ckpt-every-steps", str(args.ckpt_every), "--device", args.device,
              "--amp", args.amp, "--epochs", "100"]
    if args.deterministic:
        common.append("--deterministic")
    cmd = lambda out, *extra: [sys.executable, str(SCRIPT), "--out", str(out), *common, *extra]  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="bench-exact-") as tmp:
        root = Path(args.out) if args.out else Path(tmp)
        a, b = root / "uninterrupted", root / "killed"
        t0 = time.perf_counter()
        # --overwrite: a kept --out folder from an earlier run is moved aside, not silently mixed in
        subprocess.run(cmd(a, "--overwrite"), env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        t_a = time.perf_counter() - t0
        # SIGKILL right after optimizer step --kill-after, counted inside the process (course_utils.interrupt)
        killed = cmd(b, "--overwrite")
        killed[1:1] = [interrupt.__file__, str(args.kill_after)]
        code = subprocess.run(killed, env=env, cwd=REPO, stdout=subprocess.DEVNULL).returncode
        if code != -signal.SIGKILL:
            print(f"run B ended with exit code {code} before step {args.kill_after}; nothing was killed", file=sys.stderr)
            return 1
        killed_at = last_step(b / "metrics.jsonl")
        subprocess.run(cmd(b, "--resume"), env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        ra, rb = train_records(a / "metrics.jsonl"), train_records(b / "metrics.jsonl")
    mismatches = [s for s in range(1, args.steps + 1)
                  if s not in ra or s not in rb or ra[s]["loss"] != rb[s]["loss"] or ra[s]["grad_norm"] != rb[s]["grad_norm"]]
    ok = not mismatches and len(ra) == args.steps
    text = (f"device {args.device}, deterministic {args.deterministic}, amp {args.amp}: {args.steps} steps, "
            f"SIGKILL right after optimizer step {args.kill_after} (logged up to step {killed_at}; checkpoint every "
            f"{args.ckpt_every}), resumed; "
            f"uninterrupted run {t_a:.1f} s\n"
            f"per-step loss and grad norm identical: {'YES' if ok else 'NO'}"
            + (f" (differ at steps {mismatches[:10]}{'...' if len(mismatches) > 10 else ''})" if mismatches else ""))
    print(text)
    write_json(f"resume_exact_{args.device.split(':')[0]}",
               {"ok": ok, "killed_at": killed_at, "mismatches": mismatches, "steps": args.steps,
                "device": args.device, "deterministic": args.deterministic, "amp": args.amp,
                "losses_uninterrupted": [ra[s]["loss"] for s in sorted(ra)],
                "losses_resumed": [rb[s]["loss"] for s in sorted(rb)], "table": text}, args.json)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
