"""Criterion (c) of ``bench/preemption.py``: after every kill, a job's samples and losses are an uninterrupted run's.

The script writes one ledger line per executed step (``--sample-ledger``: the step and its sample indices, a step
trained again after a kill written again) and its losses to ``metrics.jsonl``. :func:`trajectory` reads them once,
before the job's folder is deleted; :func:`check_against` compares them with the same seed's uninterrupted run.
Pitfall: a step executed twice must have seen the same samples both times, and only its last execution belongs to
the trajectory that survived.
"""
from __future__ import annotations

from pathlib import Path

from course_utils.monitor import read_metrics

__all__ = ["trajectory", "check_against"]


def trajectory(out: Path) -> dict:
    """The run's ledger and losses: {"steps": {step: indices}, "replays_differ": n, "losses": [...], "eval": {...}}."""
    steps: dict[int, list[int]] = {}
    differ = 0
    for record in read_metrics(out / "sample_ledger.jsonl"):  # every executed step, abandoned ones included
        indices = record["indices"][0]
        differ += record["step"] in steps and steps[record["step"]] != indices
        steps[record["step"]] = indices  # the last execution of a step is the surviving trajectory's
    metrics = read_metrics(out / "metrics.jsonl")
    losses = [(r["step"], r["loss"]) for r in metrics if r.get("split") == "train"]
    evals = [{k: r[k] for k in ("step", "loss", "acc", "loss_ema", "acc_ema")} for r in metrics if r.get("split") == "val"]
    return {"steps": steps, "replays_differ": differ, "losses": losses, "eval": evals}


def check_against(got: dict, reference: dict, epoch_steps: int, epochs: int, batch: int) -> dict[str, bool]:
    """Criterion (c) on a job's trajectory: ``reference`` is the same seed's uninterrupted run, ``epochs`` of
    ``epoch_steps`` steps of ``batch`` samples."""
    seen = [[i for step in range(e * epoch_steps + 1, (e + 1) * epoch_steps + 1) for i in got["steps"].get(step, [])]
            for e in range(epochs)]
    return {"replayed steps saw the same samples": got["replays_differ"] == 0,
            "each sample once per epoch": sorted(got["steps"]) == list(range(1, epochs * epoch_steps + 1)) and all(
                len(epoch) == len(set(epoch)) == epoch_steps * batch for epoch in seen),
            "same samples as uninterrupted": got["steps"] == reference["steps"],
            "same losses as uninterrupted": got["losses"] == reference["losses"] and got["eval"] == reference["eval"]}
