"""course_utils.estimate's FLOP count, MFU and memory budget (taught in 08b §1–3) against what torch does."""
from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_utils.estimate import (conv_linear_flops, matmul_peak_flops, measured_memory, memory_budget, mfu,
                                   profile_once, saved_activation_bytes, training_flops)
from course_utils.models import build_model, count_parameters


@pytest.mark.parametrize("name", ["small", "tiny"])
@pytest.mark.parametrize("batch", [1, 8])
def test_analytic_count_agrees_with_flop_counter_on_course_models(name, batch):
    torch.manual_seed(0)
    model, x = build_model(name), torch.randn(batch, 3, 32, 32)
    counted, by_hand = training_flops(model, x), conv_linear_flops(model, x)
    assert math.isclose(by_hand.forward, counted.forward, rel_tol=0.01), (by_hand, counted)
    assert math.isclose(by_hand.total, counted.total, rel_tol=0.01), (by_hand, counted)
    # backward is about 2x forward, a bit less: the first layer computes no input gradient
    assert 1.6 < counted.backward / counted.forward < 2.0


def test_first_layer_input_gradient_is_counted_when_the_input_requires_grad():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
    x = torch.randn(4, 3, 16, 16, requires_grad=True)
    counted, by_hand = training_flops(model, x), conv_linear_flops(model, x)
    assert counted == by_hand and counted.backward == 2 * counted.forward


def test_hand_formula_for_one_strided_conv():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1))
    flops = conv_linear_flops(model, torch.randn(2, 3, 9, 9))
    assert flops.forward == 2 * 2 * 4 * 5 * 5 * 3 * 3 * 3   # H_out = (9 + 2 - 3) // 2 + 1 = 5
    assert flops.backward == flops.forward                  # weight gradient only


def test_memory_budget_parts_match_adamw_on_a_course_model():
    model = build_model("small")
    n = count_parameters(model)
    budget = memory_budget(n, "adamw", activations_bytes=1000)
    optimizer = torch.optim.AdamW(model.parameters())
    F.cross_entropy(model(torch.randn(2, 3, 32, 32)), torch.tensor([0, 1])).backward()
    optimizer.step()
    assert budget.weights == sum(p.numel() * p.element_size() for p in model.parameters()) == 4 * n
    assert budget.grads == sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    moments = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                  for k, t in s.items() if k != "step")
    assert budget.optimizer_states == moments == 8 * n
    assert budget.total == 16 * n + 1000
    assert memory_budget(n, "sgd").optimizer_states == 0
    with pytest.raises(ValueError):
        memory_budget(n, "lion")


def test_mfu_is_a_ratio_and_rejects_a_zero_peak():
    assert mfu(3e12, 1e13) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        mfu(1.0, 0.0)


def test_matmul_peak_is_positive_and_leaves_the_global_random_stream_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    assert matmul_peak_flops(64, repeats=2) > 0
    assert torch.equal(torch.rand(3), expected)


def test_saved_activations_of_an_mlp_are_the_relu_outputs_once_and_the_loss_buffers():
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 10))
    x, y = torch.randn(5, 8), torch.zeros(5, dtype=torch.long)
    # ReLU outputs (each also the next Linear's input, counted once), log-softmax output, the labels, a scalar
    assert saved_activation_bytes(model, x, y) == 4 * 5 * (32 + 16) + 4 * 5 * 10 + 8 * 5 + 4


def test_measured_memory_matches_the_budget_for_adamw_and_counts_the_real_tensors():
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 10))
    x, y = torch.randn(5, 8), torch.zeros(5, dtype=torch.long)
    optimizer = torch.optim.AdamW(model.parameters())
    counted = measured_memory(model, optimizer, x, y)
    n = count_parameters(model)
    assert counted == memory_budget(n, "adamw", activations_bytes=saved_activation_bytes(model, x, y))
    assert all(p.grad is not None for p in model.parameters()) and len(optimizer.state) == 4  # a real step ran
    sgd = measured_memory(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y)
    assert sgd.optimizer_states == 0 and sgd.weights == 4 * n


def test_profile_once_records_the_ops_and_keeps_stderr(capfd):
    prof = profile_once(lambda: torch.randn(16, 16) @ torch.randn(16, 16))
    assert any(e.key == "aten::mm" for e in prof.key_averages())
    os.write(2, b"still here\n")
    assert "still here" in capfd.readouterr().err


def test_bench_mfu_check_runs_on_the_cpu_and_writes_a_plausible_mfu(tmp_path):
    """bench/mfu_check.py (part (e) of bench/gpu_check.sh) at toy size: a JSON with an MFU in (0, 1]."""
    path = Path(__file__).resolve().parent.parent / "bench" / "mfu_check.py"
    spec = importlib.util.spec_from_file_location("bench_mfu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    try:
        assert module.main(["--device", "cpu", "--quick", "--json", str(tmp_path / "mfu.json")]) == 0
    finally:
        torch.set_num_threads(threads)
    results = json.loads((tmp_path / "mfu.json").read_text())["results"]
    assert set(results) == {"fp32"} and 0 < results["fp32"]["mfu"] <= 1
