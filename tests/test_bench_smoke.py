"""Smoke test of bench/overhead.py: its internals run a handful of steps and produce sane output.

No timing assertions: benchmarks are run by hand (python bench/overhead.py), not by pytest.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from tests.support.bench_scripts import load


@pytest.fixture(scope="module")
def overhead():
    return load("overhead")


def test_pro_arm_writes_metrics_and_checkpoints(overhead, tmp_path):
    setup = overhead.Setup(width=4, batch_size=8, n_batches=2, log_every=2, ckpt_every=3)
    device = torch.device("cpu")
    torch.manual_seed(0)
    init = overhead.build_model("small", width=4)
    batches = overhead.make_batches(setup, device)
    assert len(batches) == 2 and batches[0][0].shape == (8, 3, 32, 32)
    pro = overhead.ProArm(init, batches, setup, device, tmp_path, total_steps=4, profile=True)
    times = [pro.step() for _ in range(4)]
    pro.close()
    assert all(t > 0 for t in times)
    assert len(pro.save_times) == 1  # step 3 of 4
    assert (tmp_path / "checkpoints" / "step_00000003.pt").exists()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert list((tmp_path / "tensorboard").iterdir())
    assert {"forward+backward", "clip", "ema", "monitor"} <= set(pro.timers)
    # the pro arm trains the same model: its weights moved, the EMA copy too
    assert not torch.equal(next(pro.model.parameters()), next(init.parameters()))


def test_measure_and_report(overhead):
    setup = overhead.Setup(width=4, batch_size=8, n_batches=2, log_every=2, ckpt_every=4)
    result = overhead.measure(setup, steps=2, repeats=2, device=torch.device("cpu"), warmup=1, log=lambda *_: None)
    assert result["repeats"] == 2 and len(result["rows"]) == 2
    for row in result["rows"]:
        assert row["bare_sps"] > 0 and row["pro_sps"] > 0
        assert math.isclose(row["ratio"], row["pro_sps"] / row["bare_sps"])
    assert math.isclose(result["overhead"], 1 - result["ratio"]["median"])
    text = overhead.report(result, 0.03)
    assert "pro / bare throughput" in text and "overhead (median over repeats)" in text


def test_main_exit_code_follows_threshold(overhead, tmp_path):
    args = ["--steps", "2", "--repeats", "1", "--batch-size", "4", "--width", "4", "--json", str(tmp_path / "o.json")]
    # a limit no run can meet (pro 1000x faster than bare: two smoke steps once measured pro 2x faster) must fail;
    # a huge one must pass
    assert overhead.main([*args, "--max-overhead", "-999"]) == 1
    assert overhead.main([*args, "--max-overhead", "10"]) == 0
    saved = json.loads((tmp_path / "o.json").read_text())
    assert saved["passed"] is True and "machine" in saved and saved["steps_per_repeat"] == 2


def test_peers_bench_runs_all_three_arms(tmp_path):
    """bench/peers.py at toy size: three arms timed side by side, a verdict (Lightning: requirements.txt includes
    bench/requirements.txt, so a missing install fails here instead of skipping)."""
    import lightning  # noqa: F401
    peers = load("peers")
    setup = peers.Setup(width=4, batch_size=8, n_batches=2, ckpt_every=3, log_every=peers.LOG_EVERY, loggers=("jsonl",))
    tp = peers.throughput(setup, steps=3, warmup=1, repeats=3, log=lambda *_: None)
    assert [r["order"][0] for r in tp["rows"]] == ["bare", "ours", "lightning"]  # the order rotates
    for row in tp["rows"]:
        assert row["bare_sps"] > 0 and row["ours_sps"] > 0 and row["lightning_sps"] > 0
        assert math.isclose(row["ours_vs_lightning"], row["ours_sps"] / row["lightning_sps"])
    fake_resume = {"bare": {"steps": 30, "differ": 10, "differ_beyond_1e-6": 10, "first_differing_step": 21,
                            "resume_error": ""},
                   "ours": {"steps": 30, "differ": 1, "differ_beyond_1e-6": 0, "first_differing_step": 9,
                            "resume_error": ""}}
    text, ok = peers.report(tp, fake_resume, setup, 3, 3)
    assert "ours / Lightning" in text and "steps whose loss differs" in text
    assert ok is False, "a single differing step after resume must fail the bench"
