"""Refresh the generated blocks of bench/RESULTS.md from bench/results/*.json; the prose around them stays.

Each bench script writes ``bench/results/<name>.json``: the raw numbers and, for most, a ``machine`` header
and its table as printed (``bench/under_load.py`` writes no table, so its section is all prose). In RESULTS.md the block

    <!-- results: overhead -->
    ...
    <!-- /results -->

holds that run's ``Command:`` line, its table verbatim and the sentences computed from the JSON (ratios, verdicts
against targets). Everything outside the blocks is written by hand: the conditions of the run, what the numbers
mean, history. The pitfall this avoids: a generator that rewrote the whole file erased every hand-written part,
and a number typed into prose drifts from its JSON when the bench runs again. So a number or a verdict that
comes from a run belongs in a block, never in the prose.

    python bench/make_results.py            # after running any bench script: rewrite the blocks in place
    python bench/make_results.py --check    # exit 1, naming them, if blocks differ from the JSON (the tests run this)
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Callable

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
BLOCK = re.compile(r"<!-- results: (?P<name>[a-z0-9_]+) -->\n.*?<!-- /results -->", re.S)


def within(ok: bool) -> str:
    return "within" if ok else "OVER"


def overhead(d: dict) -> list[str]:
    prof, ratio = d["profile_ms_per_step"], d["ratio"]
    extras = sum(v for k, v in prof.items() if k not in ("forward+backward", "optimizer+scheduler"))
    return [f"Median slowdown {100 * d['overhead']:.2f}% ({within(d['overhead'] <= d['max_overhead'])} the "
            f"{100 * d['max_overhead']:.0f}% limit); pro/bare ratio median {ratio['median']:.3f}, range "
            f"{ratio['min']:.3f}-{ratio['max']:.3f} over {ratio['n']} repeats. Timed directly, the extras (clip, NaN "
            f"check, EMA, monitor, checkpoint pro rata) take {extras:.2f} ms of the {sum(prof.values()):.0f} ms per step "
            f"that the profile times; the hang watchdog's heartbeat, timed alone, takes "
            f"{1e6 * d['heartbeat_s_per_step']:.1f} us per step ({100 * d['heartbeat_fraction']:.4f}% of a step)."]


def checkpoint_cost(d: dict) -> list[str]:
    r, t, res = d["ratios"], d["targets"], d["results"]
    speed = {mode: res["steps"] / statistics.median(m["seconds"]) for mode, m in res["training"].items()}
    rate = {k: res["load"]["file_bytes"] / statistics.median(v) / 1e9 for k, v in res["load"].get("hash", {}).items()}
    lines = [f"Save: {r['save']:.2f}x a plain `torch.save` + fsync ({within(r['save'] <= t['save'])} the {t['save']}x "
             f"target); peak extra memory of a synchronous save: {100 * r['memory']:.1f}% of the state "
             f"({within(r['memory'] <= t['memory'])} the {100 * t['memory']:.0f}% target). Load: {r['load']:.2f}x a "
             f"plain `torch.load` in a fresh process ({within(r['load'] <= t['load'])} the {t['load']}x target). "
             f"Asynchronous save: each save stalls the loop for {r['stall']:.2f}x the time of a plain `torch.save` "
             f"({within(r['stall'] <= t['stall'])} the {t['stall']}x target). End to end: "
             f"{speed['async saves']:.3f} steps/s with asynchronous saves, {speed['sync saves']:.3f} with synchronous "
             f"ones, {speed['no saves']:.3f} without saving."]
    if len(rate) == 2:
        lines.append(f"Over the file in the page cache, xxh3-128 hashed {rate['xxh3_128']:.1f} GB/s and SHA-256 "
                     f"{rate['sha256']:.1f} GB/s ({rate['xxh3_128'] / rate['sha256']:.0f}x).")
    if "load_avg_1m_at_end" in res:
        lines.append(f"Load average {d['machine']['load_avg_1m_at_start']} at the start, "
                     f"{res['load_avg_1m_at_end']:.2f} at the end (the bench's own processes count in it).")
    return lines


def amp(d: dict) -> list[str]:
    has = {True: "has", False: "has no", None: "may or may not have"}[d["machine"].get("cpu_bf16_instructions")]
    ratios = [r["speedup_vs_fp32"] for r in d["speed"] if r.get("dtype") == "bf16" and "speedup_vs_fp32" in r]
    shown = ", ".join(f"{r:.2f}x" for r in ratios)
    if ratios and all(r > 1 for r in ratios):
        speed = f"bf16 autocast was faster than fp32 on every model here ({shown})"
    elif ratios and all(r < 1 for r in ratios):
        speed = f"bf16 autocast was slower than fp32 on every model here ({shown})"
    else:
        speed = f"bf16 autocast vs fp32 here: {shown}"
    return [f"This CPU {has} bf16 matrix instructions (AVX512-BF16/AMX, from /proc/cpuinfo); {speed}."]


def suite_time(d: dict) -> list[str]:
    parts = []
    for b in d["budgets"]:
        outcome = "no test failed" if b["exit_code"] == 0 else f"exit code {b['exit_code']}"
        parts.append(f"`{b['command']}` {b['wall_s']:.0f} s ({within(b['wall_s'] <= b['budget_s'])} the "
                     f"{b['budget_s']:.0f} s budget), {outcome}")
    if not parts:   # run with pytest arguments of its own: no budget applies
        parts = [f"`pytest {' '.join(d['pytest_args'])}` {d['wall_s']:.0f} s, no budget checked"]
    lines = [f"This run: {'; '.join(parts)}."]
    if d["failures"]:
        lines.append(f"Failed: {', '.join(dict.fromkeys(f['test'] for f in d['failures']))}.")
    if d.get("slowest_tests"):
        lines += ["", "The slowest tests of this run's `pytest`:", *(f"- {t['seconds']:.1f} s `{t['test']}`"
                                                         for t in d["slowest_tests"][:8])]
    return lines


def grading(d: dict) -> list[str]:
    learners, notebooks = d["learners"], len(d["notebooks"])
    lines = [f"The sandbox adds {100 * d['overhead']:.1f}% ({within(d['overhead'] <= d['max_overhead'])} the "
             f"{100 * d['max_overhead']:.0f}% limit) to grading {learners} learner(s) x {notebooks} notebook(s) with "
             f"--jobs {d['jobs']}: {d['sandbox_s'] / learners:.0f} s of wall time per learner for those notebooks."]
    if d.get("workbook"):
        w = d["workbook"]
        lines.append(f"A learner's whole workbook ({w['notebooks']} graded notebooks) takes {w['seconds']:.0f} s in "
                     f"the sandbox with --jobs {d['jobs']}.")
    if d.get("homework"):
        h = d["homework"]
        rounds = ", ".join(f"{r['sandbox']:.1f}/{r['plain']:.1f}" for r in h["rounds"])
        over = sum(r["sandbox"] / r["plain"] - 1 > d["max_overhead"] for r in h["rounds"])
        lines.append(f"One learner's homework (the reference scripts, all five upgrade checks, --jobs 1) takes "
                     f"{h['sandbox_s']:.0f} s in the sandbox ({within(h['sandbox_s'] <= h['max_seconds'])} the "
                     f"{h['max_seconds']:.0f} s limit) and {h['plain_s']:.0f} s without it: {100 * h['overhead']:.1f}% "
                     f"overhead ({within(h['overhead'] <= d['max_overhead'])} the {100 * d['max_overhead']:.0f}% "
                     f"limit; over it in {over} of {len(h['rounds'])} rounds, sandbox/plain s {rounds}); "
                     + ("every check passed in both arms." if h["all_checks_passed"] else "a check failed in an arm."))
    return lines


def ddp(d: dict) -> list[str]:
    runs = d["samples_per_sec"]
    one = statistics.median(runs["1 process x 1 thread"])
    threads = [v / one for v in runs["1 process x 2 threads"]]
    return [f"Two processes of one thread reach {100 * d['efficiency']:.0f}% of the ideal (twice one process of one "
            f"thread): {d['speedup_2_processes']:.2f}x one process. One process with two threads: "
            f"{d['speedup_2_threads']:.2f}x (from {min(threads):.2f}x to {max(threads):.2f}x over the repeats)."]


def peers(d: dict) -> list[str]:
    missed = []
    if d.get("throughput"):
        tp = d["throughput"]
        if tp["ours_vs_bare"]["median"] < 0.99:
            missed.append("ours within 1% of the bare loop")
        if tp["ours_vs_lightning"]["median"] < 1.0:
            missed.append("ours at least as fast as Lightning")
    if d.get("resume") and d["resume"]["ours"]["differ"] != 0:
        missed.append("ours resumes exactly")
    return [f"Goals missed in this run: {'; '.join(missed)}." if missed else "Every goal was met in this run."]


def threads(d: dict) -> list[str]:
    many = d["cores"]
    notes = []
    for label, seconds in d["seconds"].items():
        ratio = statistics.median(seconds[str(many)]) / statistics.median(seconds["1"])
        notes.append(f"{label}: {many} threads took {ratio:.2f}x the time of 1 thread "
                     f"({'faster' if ratio < 1 else 'slower'})")
    return ["; ".join(notes) + "."]


def rollback(d: dict) -> list[str]:
    wall, losses = d["wall_s"], [e["loss_ema"] for e in d["evals"].values()]
    return [f"Wall time against the unspiked run: rollback {wall['rollback'] - wall['unspiked']:+.2f} s, stop + manual "
            f"resume {wall['stop + manual resume'] - wall['unspiked']:+.2f} s. The final EMA eval losses are at most "
            f"{max(losses) - min(losses):.3f} apart."]


def grading_class(d: dict) -> list[str]:
    notes = []
    for jobs, c in sorted(d["jobs"].items()):
        rows = c["learners"]
        history = [r for r in rows if not r["verdicts"]["commits"].startswith("无历史")]
        notes.append(f"--jobs {jobs}: {c['wall_s']:.0f} s for {len(rows)} learners, {c['seconds_per_learner']:.0f} s per "
                     f"learner ({within(c['passed'])} the {c['max_seconds']:.0f} s limit); "
                     f"{sum(r['runs'] for r in history) / max(1, len(history)):.1f} check runs per learner with history "
                     "(5 of them at the head).")
    return notes


def accumulation(d: dict) -> list[str]:
    med = {k: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
           for k, runs in sorted(d["runs"].items(), key=lambda kv: int(kv[0]))}
    lowest = min(med, key=lambda k: med[k][0])
    speeds = [s for _, s in med.values()]
    trend = "rise" if all(a < b for a, b in zip(speeds, speeds[1:])) else "do not rise at every K"
    return [f"Peak memory is lowest at K={lowest} ({med[lowest][0]:.0f} MiB, {med[lowest][0] / med['1'][0]:.2f}x "
            f"K=1); samples/s {trend} with K (K={max(med, key=int)}: {speeds[-1] / speeds[0]:.2f}x K=1)."]


def forkserver_choice(d: dict) -> list[str]:
    t = {k: v["median_s"] for k, v in d["launchers"].items()}
    ours, stdlib, fresh = t["tests/support/forkserver.py"], t["multiprocessing forkserver + preload"], t["fresh interpreter"]
    faster = "the standard library's" if stdlib < ours else "the tests'"
    return [f"Of a fresh interpreter's time from start to exit, the tests' fork server takes {100 * ours / fresh:.1f}%, "
            f"the standard library's {100 * stdlib / fresh:.1f}%: {faster} is faster by {abs(ours - stdlib):.2f} s per run."]


def resume_doctor(d: dict) -> list[str]:
    bugs = [r for r in d["rows"] if r["upstream"] != "control"]
    controls = [r for r in d["rows"] if r["upstream"] == "control"]
    every = [r for r in bugs if r["caught"] == r["runs"]]
    slowest = {k: max((r[k] for r in d["rows"] if r[k] is not None), default=None) for k in ("max_s_quiet", "max_s_hogs")}
    times = ", ".join(f"{v:.0f} s {label}" for label, v in (("quiet", slowest["max_s_quiet"]),
                                                             (f"beside {d['hogs']} CPU hogs", slowest["max_s_hogs"])) if v)
    return [f"Zoo: {len(every)} of {len(bugs)} bugs caught in every run ({sum(r['runs'] for r in bugs)} runs); the "
            f"expected component in {sum(r['component_right'] == r['runs'] for r in bugs)} of {len(bugs)}, the expected "
            f"first differing step in {sum(r['step_right'] == r['runs'] for r in bugs)} of {len(bugs)}. Controls: "
            f"{sum(r['false_alarms'] for r in controls)} false alarms in {sum(r['runs'] for r in controls)} runs. "
            f"Slowest doctor run per script: {times} ({within(all(v is None or v <= 180 for v in slowest.values()))} "
            "the 3-minute target)."]


def preemption(d: dict) -> list[str]:
    v, i, loads = d["verdict"], d["inputs"], d["load_avg_1m"]
    met = lambda ok: "met" if ok else "MISSED"  # noqa: E731
    yes = lambda ok: "yes" if ok else "no"  # noqa: E731
    what, expectation, ends = "", "", ""  # a run before the replays and the forecast (2026-12-06 03:09) has neither
    if "forecast" in d:
        what = " (the model replayed through each seed's own kill times)"
        expectation = f"; the expectation E[T], not judged: worst {100 * v['worst error of the expectation']:.1f}%"
        ends = (f" Both ends of the grid outside that range, so that it could fail on either side: "
                f"{yes(v['grid ends outside the near-best range'])} (forecast before the jobs: "
                f"{d['forecast']['near-best range (steps)']}, ends outside: "
                f"{yes(d['forecast']['grid ends outside the near-best range'])}).")
    return [f"Prediction{what} within ±15% of the measured median at every interval: {met(v['prediction within 15%'])} "
            f"(worst {100 * v['worst prediction error']:.1f}%{expectation}). Young's τ* = {i['tau_steps']:.1f} steps "
            f"inside the near-best range {v['near-best range (steps)']}: {met(v['tau* inside the near-best range'])}.{ends} Exact "
            f"resume (ledger: each sample once per epoch, same samples and losses as uninterrupted) in "
            f"{v['runs checked']} runs across {v['kills']} kills: {met(v['exact resume after every kill'])} (at least "
            f"20 kills: {met(v['at least 20 kills'])}). Load average (1 min) {min(loads):.2f}-{max(loads):.2f} "
            f"during the bench, with {i['hogs']} CPU hog(s) of its own."]


VERDICTS: dict[str, Callable[[dict], list[str]]] = {
    "overhead": overhead, "checkpoint_cost": checkpoint_cost, "amp_cpu": amp, "suite_time": suite_time,
    "grading": grading, "ddp": ddp, "peers": peers, "threads": threads, "rollback": rollback,
    "grading_class": grading_class, "accumulation": accumulation, "forkserver_choice": forkserver_choice,
    "resume_doctor": resume_doctor, "preemption": preemption, "preemption_hogs": preemption,
}


def meta(d: dict) -> list[str]:
    if "machine" not in d:
        return []
    m = d["machine"]
    return [f"Command: `{m['command']}` · {m['date']} · {m['cpu_model']}, {m['cpu_count']} cores · torch {m['torch']}, "
            f"{m['torch_threads']} torch thread(s) · load average at start {m['load_avg_1m_at_start']}", ""]


def block(name: str) -> str:
    """The block for ``results/<name>.json``, markers included."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        body = [f"Not recorded yet: `bench/results/{name}.json` is missing; run its bench script, then "
                "`python bench/make_results.py`."]
    else:
        d = json.loads(path.read_text())
        verdicts = VERDICTS[name](d) if name in VERDICTS else []
        body = meta(d) + ["```", d["table"], "```"] + ([""] + verdicts if verdicts else [])
    return "\n".join([f"<!-- results: {name} -->", *body, "<!-- /results -->"])


def missing_blocks(text: str) -> list[str]:
    """JSON files with a table that RESULTS.md has no block for."""
    named = {m["name"] for m in BLOCK.finditer(text)}
    return sorted(p.stem for p in RESULTS.glob("*.json") if "table" in json.loads(p.read_text()) and p.stem not in named)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale or missing")
    args = parser.parse_args(argv)
    path = BENCH / "RESULTS.md"
    text = path.read_text()
    fresh = {m["name"]: block(m["name"]) for m in BLOCK.finditer(text)}
    stale = [m["name"] for m in BLOCK.finditer(text) if m[0] != fresh[m["name"]]]
    missing = missing_blocks(text)
    for name in missing:
        print(f"RESULTS.md has no block for results/{name}.json: add `<!-- results: {name} -->` ... "
              "`<!-- /results -->` where its section belongs", file=sys.stderr)
    if args.check:
        for name in stale:
            print(f"stale block: {name} (run python bench/make_results.py)", file=sys.stderr)
        return 1 if stale or missing else 0
    if stale:   # every block rebuilt from its JSON; everything outside the blocks unchanged
        path.write_text(BLOCK.sub(lambda m: fresh[m["name"]], text))
    print(f"RESULTS.md: {len(stale)} block(s) rewritten ({', '.join(stale) or 'none'})")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
