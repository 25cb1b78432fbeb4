"""The preemption bench's printed result and its plot (``bench/preemption.py`` measures, this module shows).

Kept apart so that the bench itself stays one screenful per part: what is run, what is predicted, what is judged.
"""
from __future__ import annotations

from pathlib import Path

from _common import format_table

from course_utils.estimate_ckpt import daly_interval

__all__ = ["report", "plot"]


def report(setup: dict, inputs: dict, pre: dict, told: dict, rows: list[dict], verdict: dict) -> str:
    """The printed result: the conditions (``setup["conditions"]``), the inputs, the intervals and the criteria."""
    lines = [setup["conditions"], "", "measured inputs (interleaved with the jobs)"]
    r, r0 = inputs["R_spread"], inputs["R0_spread"]
    table = [[f"work W (uninterrupted, no saves, less its own first start and its {setup['epochs']} epoch-end save(s))",
              f"{inputs['W']:.2f} s ({1e3 * inputs['step_s']:.1f} ms/step)"],
             ["first start R0 (a first process's time to its first step)",
              f"{inputs['R0']:.2f} s (IQR {r0['q1']:.2f}-{r0['q3']:.2f}, n {r0['n']})"],
             ["restart tax R (from a kill to the restarted process's first step, less one step)",
              f"{inputs['R']:.2f} s (IQR {r['q1']:.2f}-{r['q3']:.2f}, n {r['n']})"],
             *[[f"  R's parts (bench/resume_cost.py, pre-phase): {k}", f"{v:.2f} s"] for k, v in pre["restart_tax"].items()],
             [f"save stall C, synchronous (a save every {setup['save_every']} step(s) vs none, paired by seed)",
              f"{1e3 * inputs['C_sync']:.1f} ms"],
             ["pre-phase: save stall C synchronous / --async-ckpt",
              f"{1e3 * pre['C_sync']:.1f} ms / {1e3 * pre['C_async']:.1f} ms"],
             ["Young tau* = sqrt(2 C M)", f"{inputs['tau_s']:.2f} s = {inputs['tau_steps']:.1f} steps"],
             ["Daly's refinement", f"{daly_interval(inputs['C_sync'], inputs['M']):.2f} s"]]
    lines.append(format_table(table, ["input", "value"]))
    pct = lambda x, row: f"{100 * (x / row['measured']['median'] - 1):+.1f}%"  # noqa: E731
    body = [[f"{row['steps']}", f"{row['tau_s']:.2f}", f"{row['expected_s']:.1f}", f"{row['predicted_s']:.1f}",
             f"{row['measured']['median']:.1f} ({row['measured']['q1']:.1f}-{row['measured']['q3']:.1f})",
             pct(row["predicted_s"], row), pct(row["expected_s"], row), str(row["kills"])] for row in rows]
    lines += ["", format_table(body, ["interval (steps)", "tau (s of work)", "E[T] s", "predicted s (replays, median)",
                                      "measured s, median (IQR)", "predicted / median - 1", "E[T] / median - 1", "kills"])]
    ok, yes = lambda b: "ok" if b else "MISSED", lambda b: "yes" if b else "no"  # noqa: E731
    lines += ["", format_table([
        ["(a) prediction (the seeds' replays) within ±15% of the median at every interval",
         f"worst {100 * verdict['worst prediction error']:.1f}% (E[T]: {100 * verdict['worst error of the expectation']:.1f}%,"
         " not judged)", ok(verdict["prediction within 15%"])],
        ["(b) tau* inside the intervals whose median <= the best one's 3rd quartile",
         f"{inputs['tau_steps']:.1f} in {verdict['near-best range (steps)']} steps", ok(verdict["tau* inside the near-best range"])],
        ["    (b) could fail: both ends of the grid outside that range",
         yes(verdict["grid ends outside the near-best range"]), "-"],
        ["    forecast before the jobs (pre-phase inputs, the seeds' replays)",
         f"{told['inputs']['tau_steps']:.1f} in {told['near-best range (steps)']} steps, ends outside: "
         f"{yes(told['grid ends outside the near-best range'])}", "-"],
        ["(c) after every kill: same samples, each once per epoch, same losses as uninterrupted",
         f"{verdict['runs checked']} runs, failed: {', '.join(verdict['failed checks']) or 'none'}",
         ok(verdict["exact resume after every kill"])],
        [f"at least {setup['min_kills']} kills", str(verdict["kills"]), ok(verdict[f"at least {setup['min_kills']} kills"])]],
        ["criterion", "measured", "verdict"])]
    return "\n".join(lines)


def plot(inputs: dict, rows: list[dict], curve: list[tuple[float, float]], path: Path) -> None:
    """Wall time against the interval: ``curve`` (τ, E[T]), the replays' medians, the measured medians and IQR."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(*zip(*curve), label="expected E[T], first start included (estimate_ckpt)")
    ax.plot([row["tau_s"] for row in rows], [row["predicted_s"] for row in rows], "x", markersize=9,
            label="predicted: median of the seeds' replays")
    meds = [row["measured"]["median"] for row in rows]
    err = [[m - row["measured"]["q1"] for m, row in zip(meds, rows)], [row["measured"]["q3"] - m for m, row in zip(meds, rows)]]
    ax.errorbar([row["tau_s"] for row in rows], meds, yerr=err, fmt="o", capsize=4,
                label=f"measured: median and IQR of {inputs['seeds']} seeds")
    ax.axvline(inputs["tau_s"], color="green", linestyle="--", label=f"Young tau* = {inputs['tau_s']:.2f} s")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval tau (seconds of work)")
    ax.set_ylabel("wall time to finish (s)")
    ax.set_title(f"preempted every {inputs['M']:g} s on average; W = {inputs['W']:.1f} s of work, R = {inputs['R']:.1f} s"
                 + (f", {inputs['hogs']} CPU hogs" if inputs["hogs"] else ""), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
