"""The professional script under torchrun on this machine: NCCL on GPUs (one process per GPU), gloo on a CPU.

Part (d) of ``bench/gpu_check.sh``. Standard library only (the GPU machine has its own torch and no
package index). Runs solutions/homework/train_cifar_pro.py unmodified, COURSE_FAST=1 data, TinyCNN:

- A: ``torchrun --standalone --nproc-per-node N``, uninterrupted: status "finished", the backend it used;
- B: the same, every process of the job SIGKILLed at step >= --kill-at (the agent and the ranks, which it
  starts in their own sessions), then ``--resume``: per-step losses == A's;
- C: SIGTERM to the last rank only at step >= --kill-at: status "preempted"; then ``--resume``: == A's;
- D (N == 1 only): a plain ``python`` run: == A's (one process under torchrun, DDP and NCCL included,
  computes what a plain run computes).

    python bench/ddp_check.py --device cuda --nproc 1 --deterministic --json /tmp/ddp_check.json
    python bench/ddp_check.py --device cpu --nproc 2                   # the same checks with gloo
Exit status: the number of failed checks.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "solutions" / "homework" / "train_cifar_pro.py"


def descendants(pid: int, depth: int = 99) -> list[int]:
    """``pid``'s children, their children... down to ``depth`` levels (from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, queue = [], [(pid, 0)]
    while queue:
        parent, level = queue.pop(0)
        for child in children.get(parent, []) if level < depth else []:
            found.append(child)
            queue.append((child, level + 1))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def losses(out: Path) -> list[tuple[int, float]]:
    records = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if r.get("split") == "train":
            records.append((r["step"], r["loss"]))
    return records


def last_step(out: Path) -> int:
    try:
        found = losses(out)
    except OSError:
        return 0
    return found[-1][0] if found else 0


def status(out: Path) -> dict:
    try:
        return json.loads((out / "status.json").read_text())
    except (OSError, ValueError):
        return {}


class Check:
    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args, self.root, self.failures, self.report = args, root, 0, {}
        self.train = ["--model", "tiny", "--width", "8", "--data-fraction", "0.2", "--batch-size",
                      str(16 * max(2, args.nproc)), "--epochs", "1", "--ckpt-every-steps", "5", "--log-every", "1",
                      "--device", args.device, "--no-progress", *(["--deterministic"] if args.deterministic else [])]
        self.env = {**os.environ, "COURSE_FAST": "1", "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1",
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}

    def start(self, out: Path, *extra: str, torchrun: bool = True) -> subprocess.Popen:
        head = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                str(self.args.nproc)] if torchrun else [sys.executable]
        log = open(out.with_suffix(".log"), "a")
        return subprocess.Popen([*head, str(SCRIPT), "--out", str(out), *self.train, *extra], cwd=REPO, env=self.env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_step(self, proc: subprocess.Popen, out: Path, step: int) -> bool:
        deadline = time.monotonic() + self.args.timeout
        while last_step(out) < step or status(out).get("state") != "running":
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def expect(self, name: str, ok: bool, detail: str = "") -> None:
        self.report[name] = {"ok": bool(ok), "detail": detail}
        self.failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)

    def run(self, out: Path, *extra: str, torchrun: bool = True) -> int:
        proc = self.start(out, *extra, torchrun=torchrun)
        try:
            return proc.wait(timeout=self.args.timeout)
        except subprocess.TimeoutExpired:
            self.kill_job(proc)
            return -1

    def kill_job(self, proc: subprocess.Popen) -> int:
        """SIGSTOP the agent and everything below it, then SIGKILL all; returns how many processes."""
        frozen: list[int] = []
        for pid in [proc.pid, *descendants(proc.pid)]:
            os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)
        frozen += [p for p in descendants(proc.pid) if p not in frozen]  # started meanwhile
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        deadline = time.monotonic() + 20
        while any(alive(p) for p in frozen) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.expect("B: no process of the killed job survives", not any(alive(p) for p in frozen),
                    f"{len(frozen)} processes killed")
        return len(frozen)

    def main(self) -> int:
        args, root = self.args, self.root
        a = root / "a"
        code = self.run(a)
        log = a.with_suffix(".log").read_text()
        backend = "nccl" if args.device.startswith("cuda") else "gloo"
        reference = losses(a) if (a / "metrics.jsonl").exists() else []
        self.expect("A: uninterrupted run finished", code == 0 and status(a).get("state") == "finished",
                    f"exit {code}, status {status(a).get('state')}, {len(reference)} steps")
        self.expect(f"A: {args.nproc} process(es), backend {backend}",
                    f"processes={args.nproc}" in log and f"backend={backend}" in log,
                    next((line for line in log.splitlines() if "processes=" in line), "no device line")[:200])

        b = root / "b"
        proc = self.start(b)
        reached = self.wait_step(proc, b, args.kill_at)
        self.kill_job(proc)
        code = self.run(b, "--resume")
        self.expect("B: SIGKILL of the whole job, then --resume: losses == A", reached and code == 0
                    and losses(b) == reference, f"killed after step {args.kill_at}: {reached}, resume exit {code}")

        c = root / "c"
        proc = self.start(c)
        reached = self.wait_step(proc, c, args.kill_at)
        ranks = [p for p in descendants(proc.pid, depth=1) if f"RANK={args.nproc - 1}".encode() in
                 Path(f"/proc/{p}/environ").read_bytes().split(b"\0")] if reached else []
        victim = ranks[0] if ranks else None  # the rank: a child of the agent (its DataLoader workers are not)
        if victim:
            os.kill(victim, signal.SIGTERM)
        code = proc.wait(timeout=args.timeout)
        state = status(c)
        self.expect(f"C: SIGTERM to rank {args.nproc - 1} only: preempted", victim is not None
                    and state.get("state") == "preempted" and state.get("step") == last_step(c),
                    f"status {state.get('state')} at step {state.get('step')}, torchrun exit {code}")
        code = self.run(c, "--resume")
        self.expect("C: --resume after SIGTERM: losses == A", code == 0 and losses(c) == reference)

        if args.nproc == 1:
            d = root / "d"
            code = self.run(d, torchrun=False)
            self.expect("D: plain python == torchrun with one process", code == 0 and losses(d) == reference)
        return self.failures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--nproc", type=int, required=True, help="processes (one per GPU)")
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--kill-at", type=int, default=12)
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        check = Check(args, Path(tmp))
        failures = check.main()
    summary = {"device": args.device, "nproc": args.nproc, "deterministic": args.deterministic,
               "checks": check.report, "failures": failures}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{failures} check(s) failed" if failures else "all checks passed")
    return failures


if __name__ == "__main__":
    sys.exit(main())
