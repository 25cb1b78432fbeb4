"""The professional script logs ``mfu`` (08b §2): model FLOPs per sample × samples/s ÷ the peak; its progress line shows it."""
from __future__ import annotations

import math
import time

import pytest
import torch

from course_utils.monitor import Monitor, read_metrics
from tests.support.pro_runs import TINY, run, train_records


@pytest.mark.slow  # the shared reference run: a training process
def test_every_timed_train_record_has_a_finite_mfu_in_the_unit_interval(reference):
    records = [r for r in train_records(reference) if r["samples_per_sec"] is not None]
    assert records
    for r in records:
        assert math.isfinite(r["mfu"]) and 0 < r["mfu"] <= 1, r


@pytest.mark.slow  # starts a training process
def test_a_given_peak_is_used(tmp_path):
    # a peak 1000x this machine's: the same run's mfu is tiny but present and positive
    code, out = run(tmp_path / "run", *TINY, "--max-steps", "6", "--log-every", "2", "--peak-flops", "1e15",
                    interpreter="forked")
    assert code == 0, out[-2000:]
    values = [r["mfu"] for r in train_records(tmp_path / "run") if r["samples_per_sec"] is not None]
    assert values and all(0 < v < 1e-3 for v in values), values


def test_the_progress_line_shows_the_mfu(tmp_path, capsys):
    """The tqdm line carries the mfu of the latest timed record, as metrics.jsonl has it (the Monitor's set_mfu)."""
    monitor = Monitor(tmp_path, flush_every=2, total_steps=6, progress=True)
    monitor.set_mfu(1e6, 1e11)
    for step in range(1, 7):
        monitor.log_step(step, 0, torch.tensor(2.3), torch.tensor(1.0), False, 1e-3, 32)
        time.sleep(0.002)  # a measurable window
    monitor.close()
    last = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r.get("mfu") is not None][-1]
    assert f"mfu={last['mfu']:.1%}" in capsys.readouterr().err
