"""Rebuild bench/RESULTS.md from bench/results/*.json: each table verbatim, each verdict computed.

    python bench/make_results.py        # after running any bench script
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def meta(d: dict) -> str:
    m = d["machine"]
    return (f"Command: `{m['command']}` · {m['date']} · {m['cpu_model']}, {m['cpu_count']} cores · torch {m['torch']}, "
            f"{m['torch_threads']} torch thread(s) · load average at start {m['load_avg_1m_at_start']}")


def section(title: str, d: dict | None, command: str, notes: list[str]) -> list[str]:
    lines = [f"## {title}", ""]
    if d is None:
        return lines + [f"Not recorded yet: run `{command}`, then `python bench/make_results.py`.", ""]
    return lines + [meta(d), "", "```", d["table"], "```", "", *notes, ""]


def overhead_notes(d: dict) -> list[str]:
    prof = d["profile_ms_per_step"]
    extras = sum(v for k, v in prof.items() if k not in ("forward+backward", "optimizer+scheduler"))
    verdict = "within" if d["passed"] else "OVER"
    return [f"Median slowdown {100 * d['overhead']:.2f}% ({verdict} the {100 * d['max_overhead']:.0f}% limit); "
            f"pro/bare ratio median {d['ratio']['median']:.3f}, range {d['ratio']['min']:.3f}-{d['ratio']['max']:.3f}. "
            f"Timed directly, the extras (clip, NaN check, EMA, monitor, checkpoint pro rata) take {extras:.2f} ms "
            f"of a {sum(prof.values()):.0f} ms step. What keeps them cheap: the monitor keeps values on the device and "
            "reads them back once per flush, EMA and clipping use `torch._foreach_*` kernels. The one per-step host read "
            "is the NaN guard (`clip.is_finite()`): free on CPU, one sync per step on a GPU (GradScaler does the same)."]


def checkpoint_notes(d: dict) -> list[str]:
    r, t = d["ratios"], d["targets"]
    verdict = {k: "within" if r[k] <= t[k] else "OVER" for k in t}
    res = d["results"]
    training = res["training"]
    speed = {mode: res["steps"] / statistics.median(m["seconds"]) for mode, m in training.items()}
    load = (f" The machine was shared: load average {d['machine']['load_avg_1m_at_start']:.2f} at the start and "
            f"{res['load_avg_1m_at_end']:.2f} at the end of the run (other sessions' test suites ran beside it), "
            "so the ratios include their contention." if "load_avg_1m_at_end" in res else "")
    rate = {k: res["load"]["file_bytes"] / statistics.median(v) / 1e9 for k, v in res["load"].get("hash", {}).items()}
    hashes = (f" Over the file in the page cache, xxh3-128 hashed {rate['xxh3_128']:.1f} GB/s and SHA-256 "
              f"{rate['sha256']:.1f} GB/s ({rate['xxh3_128'] / rate['sha256']:.0f}x)." if len(rate) == 2 else "")
    return [f"Save: {r['save']:.2f}x a plain `torch.save` + fsync ({verdict['save']} the {t['save']}x target). "
            "`durable.save_verified` streams `torch.save` into the temp file and hashes each write in line with "
            "xxh3-128 (no helper thread, torch's CRC-32 left on), then fsync, rename, sidecar, folder fsync. Every "
            "variant writes a new file per save and keeps its newest 2, as the manager does (a delete-then-write "
            "baseline measured the virtual disk's block reuse). No copy of the file is held: the peak extra memory "
            f"of a synchronous save is {100 * r['memory']:.1f}% of the state ({verdict['memory']} the "
            f"{100 * t['memory']:.0f}% target).",
            f"Load: {r['load']:.2f}x a plain `torch.load` in a fresh process, as a resume loads "
            f"({verdict['load']} the {t['load']}x target): one open file is hashed in a thread (one call over a "
            "read-only mapping, no copy; xxhash releases the GIL) while `torch.load(weights_only=True)` reads it, "
            "and the result is returned only if the digest matches, so the check costs almost nothing beside the "
            "load (hashed first, then loaded, it was 1.11x: the hash's 0.095 s in line). The unpickler sees the "
            "bytes before the verdict; `weights_only=True` is the guard against a payload, the hash against "
            f"damage.{hashes} Sidecars written before xxh3 (a bare SHA-256 digest) still verify, at SHA-256's "
            "speed.",
            f"Asynchronous saves (`AsyncCheckpointManager`, `--async-ckpt`): the loop stalls {r['stall']:.2f}x a plain "
            f"`torch.save` per save ({verdict['stall']} the {t['stall']}x target), the time to copy the state into "
            "host buffers that every save reuses (one state's worth of memory, the last row of the memory table; the "
            "first save allocates them). End to end, "
            f"{speed['async saves']:.3f} steps/s with asynchronous saves, {speed['sync saves']:.3f} with synchronous "
            f"ones, {speed['no saves']:.3f} without saving. The background write shares the cores with training: on a "
            "machine whose other work leaves them one core, they take turns and every ratio grows." + load]


def grading_notes(d: dict) -> list[str]:
    verdict = "within" if d["passed"] else "OVER"
    per_learner = d["sandbox_s"] / d["learners"]
    notes = [f"The sandbox adds {100 * d['overhead']:.1f}% ({verdict} the {100 * d['max_overhead']:.0f}% limit) to grading "
             f"{d['learners']} learners x {len(d['notebooks'])} notebooks with --jobs {d['jobs']}: "
             f"{per_learner:.0f} s of wall time per learner for those notebooks. Both arms run the same merged "
             "notebooks with the same scrubbed environment, COURSE_FAST=1, threads and limits; only bubblewrap differs."]
    if d.get("workbook"):
        w = d["workbook"]
        notes.append(f"A learner's whole workbook ({w['notebooks']} graded notebooks) takes {w['seconds']:.0f} s in the "
                     f"sandbox with --jobs {d['jobs']}.")
    if d.get("homework"):
        h = d["homework"]
        notes.append(f"One learner's homework (the reference scripts, all five upgrade checks, --jobs 1) takes "
                     f"{h['sandbox_s']:.0f} s in the sandbox ({'within' if h['sandbox_s'] <= h['max_seconds'] else 'OVER'} "
                     f"the {h['max_seconds']:.0f} s limit) and {h['plain_s']:.0f} s without it: "
                     f"{100 * h['overhead']:.1f}% overhead; all checks passed in both arms: {h['all_checks_passed']}"
                     + (f"; load average (1 min) {h['load_avg_1m'][0]} at its start, {h['load_avg_1m'][1]} at its end: "
                        "on a busy machine both arms stretch and their ratio says little" if h.get("load_avg_1m") else "")
                     + ".")
    return notes


def grading_class_notes(d: dict) -> list[str]:
    notes = []
    for jobs, c in sorted(d["jobs"].items()):
        rows = c["learners"]
        history = [r for r in rows if not r["verdicts"]["commits"].startswith("无历史")]
        notes.append(f"--jobs {jobs}: {c['wall_s']:.0f} s for {len(rows)} learners, {c['seconds_per_learner']:.0f} s per "
                     f"learner ({'within' if c['passed'] else 'OVER'} the {c['max_seconds']:.0f} s limit); "
                     f"{sum(r['runs'] for r in history) / max(1, len(history)):.1f} check runs per learner with history "
                     "(5 of them at the head).")
    notes.append("The class: bundles of the released baseline plus one commit per upgrade (the reference answer's "
                 "patches), and variants: upgrades 1 and 2 squashed, only upgrades 1-3 done, the workbook's notebooks in "
                 "every commit plus a notebooks-only commit, a plain homework/ folder. Each learner's verdicts (score, "
                 "commit discipline, each upgrade) must be the same with --jobs 1 and 2 (and `python "
                 "bench/grading_class.py --verdicts OLD.json` compares them with an earlier grader).")
    return notes


def amp_notes(d: dict) -> list[str]:
    bf16 = d["machine"].get("cpu_bf16_instructions")
    has = {True: "has", False: "has no", None: "may or may not have"}[bf16]
    ratios = [r["speedup_vs_fp32"] for r in d["speed"] if r.get("dtype") == "bf16" and "speedup_vs_fp32" in r]
    if ratios and all(r > 1 for r in ratios):
        speed = f"bf16 autocast was faster than fp32 on every model here ({', '.join(f'{r:.2f}x' for r in ratios)})"
    elif ratios and all(r < 1 for r in ratios):
        speed = f"bf16 autocast was slower than fp32 on every model here ({', '.join(f'{r:.2f}x' for r in ratios)})"
    else:
        speed = f"bf16 autocast vs fp32 here: {', '.join(f'{r:.2f}x' for r in ratios)}"
    return [f"This CPU {has} bf16 matrix instructions (AVX512-BF16/AMX, from /proc/cpuinfo); {speed}. Whether "
            "autocast pays on a CPU depends on those instructions and on the model, so `--amp auto` means off on "
            "CPU: measure first, then turn it on explicitly. The memory column is process RSS growth, a weak proxy "
            "(the allocator reuses memory), not an allocator peak. The second table holds on any device: without a "
            "GradScaler, fp16 gradients of a small loss underflow to zero and the step changes no weight.",
            "", "### GPU", "",
            "Not run yet (no GPU was available): `bash bench/gpu_check.sh` on a CUDA machine writes the same AMP table "
            "with `torch.cuda.max_memory_allocated`, runs every solution notebook under nbval and the deterministic "
            "kill-and-resume check, into `bench/results/gpu_check/`."]


def peers_notes(d: dict) -> list[str]:
    return [f"Needs `pip install -r bench/requirements.txt` (Lightning). Verdict of this run: "
            f"{'all goals met' if d['passed'] else 'a goal missed (see the line under the ratio table)'}. "
            "The ratios are medians of per-repeat ratios with the arm order rotated; at this step time (about 85 ms) "
            "the repeat-to-repeat spread is several percent, larger than the 1% goal, so one run cannot settle it; "
            "`bench/overhead.py` alternates single steps and measures the professional loop's extras directly "
            "(section 1). The resume table is exact: a step counts when its loss differs (==) from the "
            "uninterrupted run's."]


def threads_notes(d: dict) -> list[str]:
    many = d["cores"]
    notes = []
    for label, seconds in d["seconds"].items():
        ratio = statistics.median(seconds[str(many)]) / statistics.median(seconds["1"])
        faster = "faster" if ratio < 1 else "slower"
        notes.append(f"{label}: {many} threads took {ratio:.2f}x the time of 1 thread ({faster})")
    return ["; ".join(notes) + ". `course_utils.env.configure_cpu_threads` leaves one core free (cores - 1 "
            "threads) for the notebooks and tests: the notebook server, DataLoader workers, a second kernel or a "
            "second pytest worker take a core, and torch's OpenMP threads wait for each other at every operation."]


def ddp_notes(d: dict) -> list[str]:
    runs = d["samples_per_sec"]
    one = statistics.median(runs["1 process x 1 thread"])
    threads = [v / one for v in runs["1 process x 2 threads"]]
    return [f"Two processes of one thread reach {100 * d['efficiency']:.0f}% of the ideal (twice one process of one "
            f"thread): {d['speedup_2_processes']:.2f}x one process. One process with two threads: "
            f"{d['speedup_2_threads']:.2f}x (from {min(threads):.2f}x to {max(threads):.2f}x over the repeats): its "
            "OpenMP threads wait for each other at every operation, so other work on the machine stalls both "
            "(`bench/threads.py`). What separates two processes from the ideal: the gradient all-reduce over "
            "loopback (gloo), the script's per-step agreements (global loss, stop flag, rank 0's decisions), waiting "
            "for the slower rank, two processes sharing memory bandwidth, and the machine's other work (load average "
            "in the header). On GPUs the same script uses NCCL (`bash bench/gpu_check.sh`, part d)."]


sections = [
    section("1. Overhead of the professional loop (`bench/overhead.py`)", load("overhead"), "python bench/overhead.py",
            overhead_notes(load("overhead")) if load("overhead") else []),
    section("2. Checkpoint cost (`bench/checkpoint_cost.py`)", load("checkpoint_cost"), "python bench/checkpoint_cost.py",
            checkpoint_notes(load("checkpoint_cost")) if load("checkpoint_cost") else []),
    section("3. Resume cost (`bench/resume_cost.py`)", load("resume_cost"), "python bench/resume_cost.py",
            ["Start-up is dominated by importing torch and building the data; finding, verifying and loading the "
             "checkpoint adds the difference between the two rows."]),
    section("4. AMP on this device (`bench/amp.py`)", load("amp_cpu"), "python bench/amp.py",
            amp_notes(load("amp_cpu")) if load("amp_cpu") else []),
    section("5. Test-suite time (`bench/suite_time.py`)", load("suite_time"), "python bench/suite_time.py",
            ["Seconds per test file or notebook (nbval: one notebook = one file), from one run of the README's test "
             "command in its pytest-xdist workers, one more than the cores (so the sum is more than the wall time). Budgets on a quiet "
             "2-core machine: 8 minutes for `pytest`, 2 minutes for `pytest -m \"not slow\"`, 90 s per notebook."]),
    section("6. Cost of the grading sandbox (`bench/grading.py`)", load("grading"), "python bench/grading.py",
            grading_notes(load("grading")) if load("grading") else []),
    section("7. Data parallel on the CPU (`bench/ddp.py`)", load("ddp"), "python bench/ddp.py",
            ddp_notes(load("ddp")) if load("ddp") else []),
    section("8. Peers side by side (`bench/peers.py`)", load("peers"), "python bench/peers.py",
            peers_notes(load("peers")) if load("peers") else []),
    section("9. CPU threads (`bench/threads.py`)", load("threads"), "python bench/threads.py",
            threads_notes(load("threads")) if load("threads") else []),
    section("12. A homework class with histories (`bench/grading_class.py`)", load("grading_class"),
            "python bench/grading.py --homework-rounds 0 --class-learners 10",
            grading_class_notes(load("grading_class")) if load("grading_class") else []),
]
header = ["# Performance", "",
          "Every table is the verbatim output of the command above it (also in `bench/results/<name>.json`); the scripts "
          "interleave the variants they compare and report medians, so the ratios are the numbers to read. Scripts "
          "other than `overhead.py` run torch with one thread by default (`--threads 0` for torch's default).", ""]
text = "\n".join(header + [line for s in sections for line in s])
(BENCH / "RESULTS.md").write_text(text)
print(text)
