"""The resume doctor's comparison: align each resumed process with the uninterrupted run, find the first difference.

What: :func:`compare_chain` takes the uninterrupted run's records and one chain's processes (killed,
resumed, maybe killed again) and returns the first :class:`Finding`: the global step, when (``loaded``:
right after loading, before that step; ``step``: at that step), the component and the evidence.

Why this order: a resumed step can only differ because something it started from differs. Checked in
turn: what the checkpoint restored (weights and their rounding, buffers, optimizer state and its step
count, an EMA, a GradScaler), then the step itself: the batch (against every step of the reference,
with the sample indices as evidence), the lr, the forward's outputs (equal inputs, other outputs:
randomness), and last the state after the step. The first that differs is the cause; its
consequences are not reported.

Pitfall: the resume point is not known from outside (the script's newest checkpoint). It is the
reference step whose weights the resumed process starts with, bit for bit; failing that, the
nearest one (weights not saved exactly).

Reference machinery of the resume doctor, which the homework checks share
(``course_tools/checks/homework_resume.py``).

Example::

    finding, info = compare_chain(ref, "mid", procs, n=40)
"""
from __future__ import annotations

import json
import math
import struct
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from course_utils.resume_doctor.runs import Proc

__all__ = ["Finding", "compare_chain", "train_indices", "rounded_to"]


@dataclass
class Finding:
    chain: str
    step: int                  # the global optimizer step where it shows
    when: str                  # "loaded" (right after loading, before `step`), "step", "end" (the step count), "run"
    component: str             # weights, buffers, optimizer, step_counter, ema, grad_scaler, scheduler, data,
                               # accumulation, rng, unknown, crash, nondeterministic
    cause: str                 # a finer key (explain.py words it)
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _state(ref: Proc, j: int) -> dict[str, Any]:
    return ref.loaded if j == 0 else ref.steps[j - 1]


def rounded_to(values: list[float]) -> str | None:
    """``"float16"`` / ``"bfloat16"`` when every value is exactly representable in it (weights saved in it), else None."""
    finite = [v for v in values if math.isfinite(v) and v != 0.0]
    if len(finite) < 8:
        return None
    if all(struct.unpack("<I", struct.pack("<f", v))[0] & 0xFFFF == 0 for v in finite):
        return "bfloat16"
    if all(float(struct.unpack("<e", struct.pack("<e", v))[0]) == v for v in finite):
        return "float16"
    return None


def _align(ref: Proc, loaded: dict[str, Any], upto: int) -> tuple[int, bool]:
    """The reference step whose weights the resumed process starts with (the largest, bit for bit), or the nearest."""
    upto = min(upto, len(ref.steps))
    exact = [j for j in range(upto + 1) if _state(ref, j)["params"] == loaded["params"]]
    if exact:
        return max(exact), True
    def distance(j: int) -> float:
        a, b = _state(ref, j)["psample"], loaded["psample"]
        return sum((x - y) ** 2 for x, y in zip(a, b)) if len(a) == len(b) else math.inf
    return min(range(upto + 1), key=lambda j: (distance(j), -j)), False


def _loaded_finding(ref: Proc, loaded: dict[str, Any], c: int, exact: bool) -> tuple[str, str, dict] | None:
    """What the checkpoint of step ``c`` did not restore: (component, cause, evidence), or None."""
    want = _state(ref, c)
    if not exact:
        rounded = rounded_to(loaded["psample"])
        cause = f"rounded_{rounded}" if rounded and not rounded_to(want["psample"]) else "weights_differ"
        if loaded["dtypes"] != want["dtypes"]:
            cause = "dtype"
        gap = max(abs(x - y) for x, y in zip(loaded["psample"], want["psample"])) if want["psample"] else None
        return "weights", cause, {"dtypes": loaded["dtypes"], "reference_dtypes": want["dtypes"], "max_gap": gap,
                                  "sampled_values": len(loaded["psample"])}
    start = ref.steps[c]["before"] if c < len(ref.steps) else None  # the reference at the start of step c + 1
    mine = loaded.get("before")
    if start and mine and mine["buffers"] != start["buffers"]:
        return "buffers", "buffers", {}
    if loaded["opt"] != want["opt"] or loaded["opt_empty"] != want["opt_empty"]:
        return "optimizer", "optimizer_empty" if loaded["opt_empty"] else "optimizer_differs", {}
    if loaded["opt_step"] != want["opt_step"]:
        return "step_counter", "optimizer_step_count", {"resumed": loaded["opt_step"], "reference": want["opt_step"]}
    return _extras_finding(mine, start, "ema") if start and mine else None


def _extras_finding(mine: dict[str, Any], theirs: dict[str, Any], cause: str) -> tuple[str, str, dict] | None:
    """An EMA (or another module beside the trained one) or a GradScaler that differs at the start of a step."""
    for name in sorted(set(mine["extras"]) | set(theirs["extras"])):
        a, b = mine["extras"].get(name), theirs["extras"].get(name)
        if a == b:
            continue
        if not name.startswith("GradScaler"):
            return "ema", cause, {"module": name}
        a, b = (json.loads(x) if x else {} for x in (a, b))  # the probe records a scaler's state_dict as JSON
        return "grad_scaler", "grad_scaler", {"scaler": name, "differs": {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b))
                                                                         if a.get(k) != b.get(k)}}
    return None


def train_indices(rec: dict[str, Any]) -> list[int] | None:
    """The sample indices of the training batches a step consumed (the loader of the step's last batch)."""
    data = rec.get("data") or []
    if not data:
        return None
    tag = data[-1][0]
    found = [i for entry in data if entry[0] == tag for i in (entry[3] or [])]
    return found or None


def _epoch_of(rec: dict[str, Any]) -> int | None:
    data = rec.get("data") or []
    return data[-1][1] if data else None


def _data_finding(ref: Proc, rec: dict[str, Any], g: int, first: bool, epoch: int | None) -> tuple[str, str, dict]:
    """Why the batch of step ``g`` differs: a shifted step count, a split accumulation window, or the data order."""
    want = ref.steps[g - 1]
    mine, theirs = rec["batch"], want["batch"]
    ev = {"indices": _short(train_indices(rec)), "reference_indices": _short(train_indices(want))}
    if len(theirs) > 1 and mine and (len(mine) != len(theirs) or mine[0] in theirs[1:]):
        at = theirs.index(mine[0]) if mine[0] in theirs else None
        return "accumulation", "window_split", {**ev, "micro_batches": len(mine), "reference_micro_batches": len(theirs),
                                               "starts_at_micro_batch": None if at is None else at + 1}
    same = [h for h in range(1, len(ref.steps) + 1) if ref.steps[h - 1]["batch"] == mine]
    if first and g - 1 in same:
        return "step_counter", "step_repeated", {**ev, "equals_reference_step": g - 1}
    if first and g + 1 in same:
        return "step_counter", "step_skipped", {**ev, "equals_reference_step": g + 1}
    if same:
        h = min(same, key=lambda s: abs(s - g))
        ev.update(equals_reference_step=h, reference_epoch=_epoch_of(ref.steps[h - 1]), epoch=_epoch_of(want))
        other_epoch = _epoch_of(ref.steps[h - 1]) != _epoch_of(want)
        at_start = _position(want) == 0
        if h < g and other_epoch and (at_start or h != 1):
            return "data", "replayed_epoch", ev
        if h < g:
            return "data", "restarted" if h == 1 else "replayed", ev
        if other_epoch:
            return "data", "skipped_epoch" if at_start else "next_epoch_order", ev
        return "data", "skipped", ev
    if train_indices(rec) is not None and train_indices(rec) == train_indices(want):
        return "data", "augmentation", ev
    return "data", "order", ev


def _position(rec: dict[str, Any]) -> int | None:
    """Which batch of its epoch the step consumed last (0: the epoch's first)."""
    data = rec.get("data") or []
    return data[-1][2] if data else None


def _short(indices: list[int] | None, n: int = 8) -> list[int] | None:
    return None if indices is None else indices[:n]


def _step_finding(ref: Proc, rec: dict[str, Any], g: int, first: bool, epoch: int | None) -> tuple[str, str, dict] | None:
    """The first thing that differs at step ``g`` (the state it started from being equal), or None."""
    want = ref.steps[g - 1]
    if not first and rec.get("before") and want.get("before"):
        extras = _extras_finding(rec["before"], want["before"], "ema_update")
        if extras is not None:
            return extras
    if rec["batch"] != want["batch"]:
        return _data_finding(ref, rec, g, first, epoch)
    if rec["lr"] != want["lr"]:
        restarted = rec["lr"] == ref.steps[0]["lr"] and g > 1
        return "scheduler", "lr_restarted" if restarted else "lr_differs", {"lr": rec["lr"], "reference_lr": want["lr"]}
    if rec["out"] != want["out"]:
        ev = {"torch_rng_equal_before_forward": _forward_rng(rec) == _forward_rng(want)}
        drawn = _loader_draws(rec, want) if first else None
        return ("rng", drawn[0], {**ev, **drawn[1]}) if drawn else ("rng", "rng_not_restored", ev)
    if rec["params"] != want["params"] or rec["opt"] != want["opt"]:
        return ("optimizer", "optimizer_update", {}) if rec["params"] == want["params"] else ("unknown", "update_differs", {})
    return None


def _forward_rng(rec: dict[str, Any]) -> str | None:
    """The torch RNG state at the step's first training forward."""
    return ((rec.get("before") or {}).get("rng") or {}).get("torch")


def _loader_draws(rec: dict[str, Any], want: dict[str, Any]) -> tuple[str, dict] | None:
    """The first resumed step's RNG told apart by the DataLoader iterators that drew a seed from the global generator.

    The resumed process's first global state (at its first such draw, else at its first forward) is looked up
    among the reference's states of the same step (at each draw, then at the forward): from there on both
    processes should draw alike. The reference drew with a loader the resumed process did not (an evaluation
    after the save), or the resumed process drew more often (an iterator the uninterrupted run had built before
    the save, or one built twice). None: no such state (the RNG was not restored), or the same draws.
    """
    mine, theirs = rec.get("draws") or [], want.get("draws") or []
    start = mine[0][1] if mine else _forward_rng(rec)
    states = [d[1] for d in theirs] + [_forward_rng(want)]
    if start is None or start not in states:
        return None
    at = states.index(start)
    ref_tags, my_tags = Counter(d[0] for d in theirs[at:]), Counter(d[0] for d in mine)
    if ref_tags - my_tags:
        return "drawn_between_save_and_resume", {"loaders_in_between": sorted(ref_tags - my_tags)}
    if my_tags - ref_tags:
        return "loader_drew_more", {"draws": dict(my_tags), "reference_draws": dict(ref_tags)}
    return None


def once_per_epoch(ref: Proc, procs: list[Proc], offsets: list[int]) -> dict[str, Any] | None:
    """The first epoch of the reference whose samples the chain saw a different number of times (or None)."""
    chain: dict[int, list[int] | None] = {}
    for proc, c in zip(procs, offsets):
        for k, rec in enumerate(proc.steps, 1):
            chain[c + k] = train_indices(rec)  # a later process redoes the killed one's unsaved steps
    epochs: dict[Any, list[int]] = {}
    for g, rec in enumerate(ref.steps, 1):
        epochs.setdefault(_epoch_of(rec), []).append(g)
    for e, steps in epochs.items():
        theirs = Counter(i for g in steps for i in (train_indices(ref.steps[g - 1]) or []))
        mine = Counter(i for g in steps for i in (chain.get(g) or []))
        if theirs and mine != theirs:
            twice = sum(1 for i, k in mine.items() if k > theirs.get(i, 0))
            never = sum(1 for i, k in theirs.items() if mine.get(i, 0) < k)
            return {"epoch": e, "samples_seen_more_often": twice, "samples_missed": never}
    return None


def _first_process(ref: Proc, proc: Proc, name: str) -> Finding | None:
    """The killed first process must repeat the reference until its kill: else the script is not deterministic."""
    if proc.loaded is not None and proc.loaded["params"] != ref.loaded["params"]:
        return Finding(name, 1, "run", "nondeterministic", "initial_weights", {})
    for g, rec in enumerate(proc.steps, 1):
        if g <= len(ref.steps) and (rec["params"] != ref.steps[g - 1]["params"] or rec["batch"] != ref.steps[g - 1]["batch"]):
            return Finding(name, g, "run", "nondeterministic", "uninterrupted_differs", {})
    return None


def compare_chain(ref: Proc, name: str, procs: list[Proc], n: int, epoch: int | None) -> tuple[Finding | None, dict]:
    """The first difference of one chain (``procs``: killed, resumed, ...) from ``ref``; and what was resumed where."""
    found, offsets, done = _first_process(ref, procs[0], name), [0], len(procs[0].steps)
    resumes = []
    for proc in procs[1:]:
        if found is not None:
            break
        if proc.loaded is None:
            found = Finding(name, done + 1, "run", "crash", "no_step", {"returncode": proc.returncode, "log": proc.tail()})
            break
        c, exact = _align(ref, proc.loaded, done)
        offsets.append(c)
        resumes.append({"killed_after": done, "resumed_after": c, "exact_load": exact})
        at_load = _loaded_finding(ref, proc.loaded, c, exact)
        if at_load is not None:
            found = Finding(name, c + 1, "loaded", *at_load)
            found.evidence["resumed_from_step"] = c
            break
        found, done = _walk(ref, proc, name, c, n, epoch)
    if found is None and procs[-1].returncode == 0 and done != n:
        found = Finding(name, min(done, n) + (done < n), "end", "step_counter", "total_steps",
                        {"optimizer_steps": done, "reference": n})
    if found is not None and found.component in ("data", "step_counter"):
        found.evidence["once_per_epoch"] = once_per_epoch(ref, procs[:len(offsets)], offsets)
    return found, {"resumes": resumes}


def _walk(ref: Proc, proc: Proc, name: str, c: int, n: int, epoch: int | None) -> tuple[Finding | None, int]:
    """Compare a resumed process's steps with the reference's, from ``c + 1``; the finding and its last global step."""
    g = c
    for k, rec in enumerate(proc.steps, 1):
        g = c + k
        if g > n:
            return Finding(name, g, "step", "step_counter", "too_many_steps", {"reference": n}), g
        diff = _step_finding(ref, rec, g, k == 1, epoch)
        if diff is not None:
            found = Finding(name, g, "step", *diff)
            found.evidence["resumed_from_step"] = c
            return found, g
    if not proc.killed() and proc.returncode != 0:
        return Finding(name, g + 1, "run", "crash", "resumed_crashed", {"returncode": proc.returncode,
                                                                         "log": proc.tail()}), g
    return None, g
