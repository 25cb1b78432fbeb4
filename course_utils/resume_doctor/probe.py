"""The resume doctor's probe: record a script's training state after every optimizer step, from outside its code.

What: ``python probe.py --record FILE [--kill K] -- SCRIPT ARG...`` (or ``-- -m MODULE ARG...``) runs the
script as ``python SCRIPT ARG...`` would (:func:`course_utils.interrupt.run_as_main`) and writes one JSON
line to ``FILE`` per optimizer step: fingerprints of the parameters and buffers, the optimizer state and
each group's lr, the RNG states, the batch the step consumed (the inputs of each top-level training
forward), the model's outputs, the sample indices the DataLoaders yielded, each DataLoader iterator that drew
its seed from the global generator (with the torch RNG state before the draw), the extra modules (an EMA)
and a GradScaler. A ``loaded`` line holds the state before the process's first step: after a resume, what the
checkpoint restored. ``--kill K``: SIGKILL right after step K is recorded (:mod:`course_utils.interrupt`).

Why from outside: the learner's script changes in nothing (no import, no flag, no log format). Everything
goes through torch's public global hooks (``register_optimizer_step_pre_hook`` / ``_post_hook``,
``register_module_forward_pre_hook`` / ``forward_hook``) and one wrapper of the DataLoader iterator's
``_next_index`` / ``__next__``, installed once ``torch.optim.optimizer`` is imported.

Pitfall: with ``num_workers > 0`` the sampler still runs in the main process (the iterator asks it for
the next indices, ahead of the batches: ``prefetch_factor``), so indices are queued when drawn and
assigned to a batch when ``__next__`` returns it. A forked worker inherits these hooks; only the main
process writes (``_Recorder.pid``).

Reference machinery of the resume doctor (:mod:`course_utils.resume_doctor`) and the homework checks
(``course_tools/checks/homework_resume.py``).

Example::

    python course_utils/resume_doctor/probe.py --record runs/p0.jsonl --kill 12 -- train.py --out runs/x
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import random
import sys
import warnings
import weakref
from collections import deque
from pathlib import Path
from typing import Any

__all__ = ["SAMPLE", "fingerprint", "install", "main"]

SAMPLE = 16  # values kept per parameter tensor (evenly spaced): how near two sets of weights are, and their rounding


def fingerprint(*tensors: Any) -> str:
    """A short hash of the tensors' dtypes, shapes and bytes (equal fingerprints: bit-identical tensors)."""
    import torch

    h = hashlib.blake2b(digest_size=8)
    for t in tensors:
        if t.is_meta:  # no data: its dtype and shape only
            h.update(f"meta{t.dtype}{tuple(t.shape)}".encode())
            continue
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _tensors(obj: Any) -> list:
    """The tensors inside nested tuples, lists and dicts (a forward's inputs or outputs)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in _tensors(obj[k])]
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in _tensors(item)]
    return []


def _sample(t) -> list[float]:
    flat = t.detach().reshape(-1)
    stride = max(1, flat.numel() // SAMPLE)
    return [float(v) for v in flat[::stride][:SAMPLE].float().cpu().tolist()]


def _torch_rng() -> str:
    import torch

    return hashlib.blake2b(torch.get_rng_state().numpy().tobytes(), digest_size=8).hexdigest()


def _rng() -> dict[str, str]:
    states = {"torch": _torch_rng(),
              "python": hashlib.blake2b(repr(random.getstate()).encode(), digest_size=8).hexdigest()}
    np = sys.modules.get("numpy")
    if np is not None:
        _, keys, pos, *_ = np.random.get_state()
        states["numpy"] = hashlib.blake2b(keys.tobytes() + str(pos).encode(), digest_size=8).hexdigest()
    return states


class _Recorder:
    """The state of one process's recording: the open file, the current step's inputs, the models seen."""

    def __init__(self, path: Path) -> None:
        self.pid, self.file = os.getpid(), open(path, "a", encoding="utf-8")
        self.steps, self.depth, self.loaded = 0, 0, False
        self.micro: list[str] = []   # top-level training forwards' inputs since the last step
        self.outputs: list[str] = []
        self.before: dict[str, Any] | None = None  # buffers, extras, RNG at the step's first training forward
        self.data: list[list] = []   # [loader tag, iterator ordinal, position, indices] fetched since the last step
        self.draws: list[list] = []  # [loader tag, torch RNG before]: iterators that drew a seed from the global generator
        self.extras: list | None = None  # weakrefs to other root modules (an EMA) and GradScalers, found once
        self.iterators: dict[str, int] = {}

    def write(self, record: dict[str, Any]) -> None:
        if os.getpid() == self.pid:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()


_rec: _Recorder | None = None


def _optimizer_state(optimizer) -> dict[str, Any]:
    import torch

    params = [p for g in optimizer.param_groups for p in g["params"]]
    moments, counts = [], []
    for p in params:
        for key, value in sorted(optimizer.state.get(p, {}).items()):
            if key == "step":
                counts.append(float(value))
            elif isinstance(value, torch.Tensor):
                moments.append(value)
    return {"params": fingerprint(*params), "dtypes": sorted({str(p.dtype) for p in params}),
            "psample": [v for p in params[:8] for v in _sample(p)], "opt": fingerprint(*moments),
            "opt_empty": not moments and not counts, "opt_step": max(counts, default=None),
            "lr": [float(g["lr"]) if not isinstance(g["lr"], torch.Tensor) else float(g["lr"].item())
                   for g in optimizer.param_groups]}


def _find_extras(model) -> None:
    """Root modules besides the trained one (an EMA copy, a teacher) and GradScalers, looked up once per process."""
    import torch

    with warnings.catch_warnings():  # isinstance() on every object touches torch's deprecated lazy aliases
        warnings.simplefilter("ignore")
        found = [o for o in gc.get_objects() if isinstance(o, (torch.nn.Module, torch.amp.GradScaler))]  # one pass
        modules = [o for o in found if isinstance(o, torch.nn.Module)]
        scalers = [o for o in found if isinstance(o, torch.amp.GradScaler)]
    trained = {id(p) for p in model.parameters()}
    children = {id(c) for m in modules for c in m.children()}
    roots = [m for m in modules if id(m) not in children and not any(id(p) in trained for p in m.parameters())
             and any(True for _ in m.parameters())]
    _rec.extras = [weakref.ref(o) for o in roots + scalers]


def _extras() -> dict[str, str]:
    import torch

    found = {}
    for i, ref in enumerate(_rec.extras):
        obj = ref()
        if isinstance(obj, torch.nn.Module):
            found[f"{type(obj).__name__}#{i}"] = fingerprint(*obj.state_dict().values())
        elif obj is not None and obj.is_enabled():
            found[f"GradScaler#{i}"] = json.dumps({k: str(v) for k, v in sorted(obj.state_dict().items())})
    return found


def _before(module) -> dict[str, Any]:
    """At the step's first training forward: what the step starts from besides weights and optimizer."""
    if _rec.extras is None:
        _find_extras(module)
    return {"buffers": fingerprint(*module.buffers()), "extras": _extras(), "rng": _rng()}


def _before_step(optimizer, *_: Any) -> None:
    if _rec.loaded:
        return
    _rec.loaded = True
    _rec.write({"kind": "loaded", **_optimizer_state(optimizer), "before": _rec.before})


def _after_step(optimizer, *_: Any) -> None:
    _rec.steps += 1
    _rec.write({"kind": "step", "n": _rec.steps, "batch": _rec.micro, "out": _rec.outputs, "before": _rec.before,
                "data": _rec.data, "draws": _rec.draws, **_optimizer_state(optimizer)})
    _rec.micro, _rec.outputs, _rec.data, _rec.draws, _rec.before = [], [], [], [], None


def _forward_pre(module, args) -> None:
    import torch

    _rec.depth += 1
    first = next(module.parameters(), None)
    # a training forward of a model with weights (not a loss module, not a meta copy measuring FLOPs)
    if _rec.depth == 1 and torch.is_grad_enabled() and module.training and first is not None and not first.is_meta:
        if _rec.before is None:
            _rec.before = _before(module)
        _rec.micro.append(fingerprint(*_tensors(args)))
        module._resume_doctor_top = True


def _forward_post(module, args, output) -> None:
    _rec.depth -= 1
    if _rec.depth == 0 and module.__dict__.pop("_resume_doctor_top", False):
        _rec.outputs.append(fingerprint(*_tensors(output)))


def _wrap_loader_iterators(dataloader) -> None:
    """Queue the indices the sampler yields (in the main process, ahead of the batches); hand them to each batch."""
    cls = dataloader._BaseDataLoaderIter
    next_index, next_batch, init = cls._next_index, cls.__next__, cls.__init__

    def __init__(self, loader, *args, **kwargs):
        ds = loader.dataset
        size = len(ds) if hasattr(ds, "__len__") else "?"
        self._rd_tag = f"{type(ds).__name__}:{size}:{loader.batch_size}"
        if getattr(loader, "generator", None) is None:  # its base seed: one draw from the global generator
            _rec.draws.append([self._rd_tag, _torch_rng()])
        init(self, loader, *args, **kwargs)
        self._rd_ordinal = _rec.iterators[self._rd_tag] = _rec.iterators.get(self._rd_tag, -1) + 1
        self._rd_queue, self._rd_position = deque(), 0

    def _next_index(self):
        index = next_index(self)
        self._rd_queue.append(index if isinstance(index, list) else [index])
        return index

    def __next__(self):
        batch = next_batch(self)
        queue = getattr(self, "_rd_queue", None)
        if queue is not None:
            indices = queue.popleft() if queue else None
            _rec.data.append([self._rd_tag, self._rd_ordinal, self._rd_position, indices])
            self._rd_position += 1
        return batch

    cls.__init__, cls._next_index, cls.__next__ = __init__, _next_index, __next__


def _hook_torch(optimizer_module) -> None:
    import torch.nn.modules.module as module
    import torch.utils.data.dataloader as dataloader

    optimizer_module.register_optimizer_step_pre_hook(_before_step)
    optimizer_module.register_optimizer_step_post_hook(_after_step)
    module.register_module_forward_pre_hook(_forward_pre)
    module.register_module_forward_hook(_forward_post, always_call=True)
    _wrap_loader_iterators(dataloader)


def install(record: Path, kill: int | None = None) -> None:
    """Record every optimizer step of this process into ``record``; SIGKILL after step ``kill``."""
    global _rec
    from course_utils import interrupt

    _rec = _Recorder(Path(record))
    _rec.write({"kind": "start", "pid": os.getpid()})

    interrupt.after_import(interrupt.OPTIMIZER_MODULE, _hook_torch)
    if kill is not None:  # its step hook runs after the recorder's (registered later): step K is written, then the kill
        interrupt.arm(kill)


def main(argv: list[str]) -> None:
    """``argv``: ``--record FILE [--kill K] -- (SCRIPT | -m MODULE) ARG...``."""
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1:]
    kill = int(opts[opts.index("--kill") + 1]) if "--kill" in opts else None
    install(Path(opts[opts.index("--record") + 1]), kill)
    from course_utils import interrupt

    interrupt.run_command(command)


if __name__ == "__main__":
    # Run from this file's path, like interrupt.py: import the package's modules, then give sys.path[0] back.
    sys.path[0] = str(Path(__file__).resolve().parents[2])
    from course_utils.resume_doctor import probe

    probe.main(sys.argv[1:])
