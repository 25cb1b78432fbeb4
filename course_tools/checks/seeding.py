"""Seeding the checks' hidden cases: torch's CPU generator only.

The checks build their models and batches on the CPU, some inside ``torch.random.fork_rng(devices=[])`` (nb07)
so that the learner's random streams are left as they were. ``torch.manual_seed`` is the wrong tool there:

- it also seeds every GPU generator, which ``fork_rng(devices=[])`` does not restore, so on a GPU machine
  running a check would reseed the learner's CUDA generators;
- while CUDA, XPU and MTIA are not initialised (always, on a CPU-only machine) it queues a seed-all for each with the caller's whole stack
  (``traceback.format_stack``, three times): 0.43 ms a call 60 frames deep against 3 us for the CPU
  generator alone (measured 2026-12-04 on the 2-core CPU machine), and a 50-seed sweep seeds 7,000 cases.

Pitfall: a check that is *about* every generator (``check_set_seed`` scrambling them, ``check_resume_equivalence``
reseeding like a fresh script) keeps ``torch.manual_seed``.

Example::

    with torch.random.fork_rng(devices=[]):
        seed_cpu(seed)
        model = nn.Linear(4, 2)   # the same weights as after torch.manual_seed(seed) on the CPU
"""
from __future__ import annotations

import torch

__all__ = ["seed_cpu"]


def seed_cpu(seed: int) -> None:
    """Seed torch's default CPU generator with ``seed`` (what ``torch.manual_seed`` does to it), nothing else."""
    torch.default_generator.manual_seed(int(seed))
