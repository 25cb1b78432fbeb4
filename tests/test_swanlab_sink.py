"""The SwanLab sink (issue 54): offline with no account, the same scalars as the other sinks, one quiet line,
never a keyboard prompt, the same run id after ``kill -9`` and ``--resume``, and not one network connection.

Run, not skipped, where swanlab is installed (requirements.txt pins it); the missing-package test runs everywhere.
"""
from __future__ import annotations

import os
import signal
import sys

import pytest
import torch

from course_utils import monitor, sinks
from tests.support.no_network import attempts, refusing_env
from tests.support.pro_runs import REFERENCE, finish, run, start, train_losses, train_records


@pytest.fixture
def own_swanlab_env(tmp_path, monkeypatch):
    """No SWANLAB_* setting from outside (a webhook would post), HOME and cwd inside tmp_path: nothing lands elsewhere."""
    for name in [n for n in os.environ if n.startswith("SWANLAB_")]:
        monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    return home


def _expected(records: list[dict]) -> dict[str, dict[int, float]]:
    """What every sink logs: the numeric fields of each train/val record, tag -> {step: value}."""
    expected: dict[str, dict[int, float]] = {}
    for record in records:
        if record["split"] in ("train", "val"):
            for tag, value in sinks._scalars(record).items():
                expected.setdefault(tag, {})[record["step"]] = value
    return expected


def _log(mon: monitor.Monitor, steps: range) -> None:
    for step in steps:
        mon.log_step(step, 0, torch.tensor(1.0 / step), torch.tensor(0.5), step % 2 == 0, 0.1, 8)


def test_monitor_swanlab_offline_same_scalars_one_line_and_resume(tmp_path, own_swanlab_env, capfd):
    pytest.importorskip("swanlab")
    handler = signal.getsignal(signal.SIGINT)
    out = tmp_path / "run"
    mon = monitor.Monitor(out, loggers=("swanlab",), flush_every=2, progress=False, config={"lr": 0.1})
    assert signal.getsignal(signal.SIGINT) is handler, "swanlab.init took over Ctrl-C; the sink must put it back"
    _log(mon, range(1, 7))
    mon.log_eval(6, 0, acc=0.25)
    mon.close()
    assert signal.getsignal(signal.SIGINT) is handler
    run_id = (out / "swanlab_run_id.txt").read_text()
    [first] = sinks.swanlab_pieces(out)
    assert first.name.endswith(f"-{run_id}") and first.parent == out / "swanlog", "its files are in the run folder"
    got_id, scalars = sinks.read_swanlab(first)
    assert got_id == run_id and scalars == _expected(monitor.read_metrics(out / "metrics.jsonl"))
    assert "val/acc" in scalars and "train/loss_smooth" in scalars

    # --resume from step 4: a new piece of the same run, steps 1-4 replayed from metrics.jsonl, then 5-8 live
    mon = monitor.Monitor(out, loggers=("swanlab",), flush_every=2, progress=False, resume_step=4)
    _log(mon, range(5, 9))
    mon.close()
    pieces = sinks.swanlab_pieces(out)
    assert len(pieces) == 2 and pieces[0] == first
    got_id, scalars = sinks.read_swanlab(pieces[1])
    assert got_id == run_id and sorted(scalars["train/loss"]) == list(range(1, 9))
    assert scalars == _expected(monitor.read_metrics(out / "metrics.jsonl")), "the newest piece holds the whole run"

    said = [line for line in "".join(capfd.readouterr()).splitlines() if line.lower().startswith("swanlab")]
    assert len(said) == 2 and all(line.startswith(f"swanlab: offline 模式,run id {run_id},日志在 ")
                                  and f"swanlab sync --id {run_id} " in line for line in said), said
    assert list(own_swanlab_env.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["home", "run"]


def test_swanlab_never_waits_for_the_keyboard(tmp_path, own_swanlab_env, monkeypatch):
    """Online without a login: swanlab.init would ask "[1/2/3]" on stdin (pytest's stdin counts as interactive
    for swanlab, as Jupyter does); the sink's settings make it an error instead."""
    pytest.importorskip("swanlab")
    monkeypatch.setenv("SWANLAB_MODE", "online")
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("swanlab asked on the keyboard"))
    with pytest.raises(RuntimeError, match="interactive prompts are disabled"):
        sinks.SwanLabSink(tmp_path, "course-0.4", {})


def test_missing_swanlab_is_one_chinese_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "swanlab", None)  # import swanlab -> ImportError
    mon = monitor.Monitor(tmp_path, loggers=("swanlab",), flush_every=1, progress=False)
    _log(mon, range(1, 3))
    mon.close()
    assert capsys.readouterr().out == "swanlab 未安装,跳过 SwanLab 记录(pip install swanlab)\n"
    assert [r["step"] for r in monitor.read_metrics(tmp_path / "metrics.jsonl")] == [1, 2], "training goes on"


@pytest.mark.slow
@pytest.mark.fresh_interpreter
def test_pro_script_swanlab_kill_resume_offline_without_network(reference, tmp_path, own_swanlab_env):
    pytest.importorskip("swanlab")
    env, net_log = refusing_env(tmp_path)
    out, args = tmp_path / "run", [*REFERENCE, "--logger", "swanlab"]
    proc = start(out, *args, interpreter="fresh", env=env, kill_after=10)  # the newest checkpoint: step 8
    code, first = finish(proc)
    assert code == -signal.SIGKILL, first[-3000:]
    code, second = run(out, *args, "--resume", interpreter="fresh", env=env)
    assert code == 0, second[-3000:]

    assert attempts(net_log) == [], "no connection and no name lookup, in any process of either start"
    run_id = (out / "swanlab_run_id.txt").read_text()
    pieces = sinks.swanlab_pieces(out)
    assert len(pieces) == 2 and all(p.name.endswith(f"-{run_id}") for p in pieces), pieces  # one run, two pieces
    got_id, scalars = sinks.read_swanlab(pieces[-1])
    assert got_id == run_id
    assert sorted(scalars["train/loss"].items()) == train_losses(reference), "the newest piece: every step, exact"
    assert scalars == _expected(monitor.read_metrics(out / "metrics.jsonl"))
    assert {"val/acc", "val/acc_ema"} <= set(scalars) and len(train_records(out)) == len(train_losses(reference))
    for output in (first, second):
        said = [line for line in output.splitlines() if line.lower().startswith("swanlab")]
        assert len(said) == 1 and said[0].startswith(f"swanlab: offline 模式,run id {run_id},"), said
    assert list(own_swanlab_env.iterdir()) == [], "nothing written to HOME"
