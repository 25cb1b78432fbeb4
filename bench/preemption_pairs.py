"""Where a preempted job's time goes, process by process: one job of ``bench/preemption.py`` beside one neighbour.

Why: in the two-epoch run of 2026-12-06 10:48 UTC the jobs took a median 1.26 s longer than the model replayed
through their own kill times (RESULTS §19). The bench times a whole job; this one times each of its processes: how
long it took to reach its first step, how many steps it then ran (the sample ledger's lines) and in how many
seconds until it was killed or exited, with a neighbour that saves never or after every step, as the bench's queue
can pair them. Same script, arguments, environment and kill times (seed 5, M = 9 s) as the bench.

Pitfall: a process's last stretch includes the run's end (evaluation, the final saves, the exit), so the ms per step
of the process that finishes is not a training speed.

    python bench/preemption_pairs.py            # five pairs one after the other, about 3 minutes
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import header, machine_info, write_json  # noqa: E402
from preemption import ARGS, HORIZON_S, POLL_S, REPO, SCRIPT, kill_times  # noqa: E402
from resume_cost import bench_env  # noqa: E402

SEED, MTBF = 5, 9.0
KINDS = {"no saves": (["--ckpt-every-steps", "0"], False), "a save every step": (["--ckpt-every-steps", "1"], False),
         "every 6 steps": (["--ckpt-every-steps", "6"], False), "every 6 steps, killed": (["--ckpt-every-steps", "6"], True)}
PAIRS = [("no saves", "no saves"), ("every 6 steps, killed", "no saves"), ("every 6 steps", "no saves"),
         ("every 6 steps, killed", "a save every step"), ("every 6 steps", "a save every step")]


def ledger_lines(path: Path) -> int:
    return sum(1 for _ in open(path, encoding="utf-8")) if path.exists() else 0


def job(out: Path, kind: str, env: dict) -> dict:
    """Run ``kind`` in ``out`` until it exits 0 (SIGKILLed at the seed's times if it is a killed kind)."""
    extra, killed_kind = KINDS[kind]
    kills = kill_times(SEED, MTBF, HORIZON_S) if killed_kind else []
    command = [sys.executable, str(SCRIPT), "--out", str(out), *ARGS, *extra, "--resume"]
    ledger, start, processes = out / "sample_ledger.jsonl", time.monotonic(), []
    while True:
        began, lines_before = time.monotonic(), ledger_lines(ledger)
        size = ledger.stat().st_size if ledger.exists() else 0
        pending = [k for k in kills if k > began - start]
        proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        first, killed = None, False
        while proc.poll() is None:
            now = time.monotonic()
            if first is None and ledger.exists() and ledger.stat().st_size > size:
                first = now
            if pending and now - start >= pending[0]:
                proc.kill()
                proc.wait()
                killed = True
                break
            time.sleep(POLL_S)
        end, steps = time.monotonic(), ledger_lines(ledger) - lines_before
        processes.append({"to_first_step_s": None if first is None else first - began, "killed": killed, "steps": steps,
                          "ms_per_step": None if first is None or not steps else 1e3 * (end - first) / steps})
        if not killed:
            return {"kind": kind, "wall_s": time.monotonic() - start, "processes": processes}


def main() -> int:
    env, info = bench_env(1), machine_info()
    print(header(info))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-pairs-") as tmp:
        for p, pair in enumerate(PAIRS):
            done: list[dict] = [{}, {}]
            outs = [Path(tmp) / f"{p}_{i}" for i in range(2)]
            threads = [threading.Thread(target=lambda i=i: done.__setitem__(i, job(outs[i], pair[i], env)))
                       for i in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for out in outs:
                shutil.rmtree(out, ignore_errors=True)
            rows.append(done)
            for i, d in enumerate(done):
                print(f"{d['kind']:>22} beside {pair[1 - i]:<22} {d['wall_s']:5.1f} s: " + "; ".join(
                    f"first step {x['to_first_step_s'] or float('nan'):.2f} s, {x['steps']} steps at "
                    f"{x['ms_per_step'] or float('nan'):.2f} ms" + (" (killed)" if x["killed"] else "")
                    for x in d["processes"]), flush=True)
    print(f"\nJSON: {write_json('preemption_pairs', {'machine': info, 'seed': SEED, 'mtbf_s': MTBF, 'pairs': rows})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
