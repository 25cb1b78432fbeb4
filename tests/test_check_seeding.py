"""The checks seed their hidden cases on the CPU generator alone (course_tools.checks.seed_cpu)."""
from __future__ import annotations

import traceback

import pytest
import torch

from course_tools.checks import seed_cpu


def test_seed_cpu_gives_the_cpu_stream_of_torch_manual_seed():
    torch.manual_seed(77)
    expected = torch.randn(5), torch.nn.Linear(3, 2).weight.detach().clone()
    torch.manual_seed(1)
    seed_cpu(77)
    assert torch.equal(torch.randn(5), expected[0])
    assert torch.equal(torch.nn.Linear(3, 2).weight, expected[1])


def test_seed_cpu_leaves_the_other_devices_alone(monkeypatch):
    """torch.manual_seed also queues a seed-all for CUDA, XPU and MTIA, each with the caller's stack; seed_cpu queues none."""
    def no_stack(*args, **kwargs):
        raise AssertionError("a GPU seed was queued")

    monkeypatch.setattr(traceback, "format_stack", no_stack)
    seed_cpu(5)
    with pytest.raises(AssertionError, match="GPU seed"):
        torch.manual_seed(5)
