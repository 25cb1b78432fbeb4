"""The files of a run folder and the clean stop (course_utils.runfolder, repro, sinks, signals).

Every file a run rewrites (status.json, config.json on both paths, metrics.jsonl on resume)
goes through the one atomic write of course_utils.durable: a failed write leaves the old file
and no temp file; a killed write leaves only a temp file that RunFolder.remove_leftovers
finds. The stop signal: a flag, not a death; DataLoader workers leave the signals to the
main process. And course_utils/__init__ names every module.
"""
from __future__ import annotations

import errno
import json
import os
import pkgutil
import signal
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import course_utils
from course_utils import durable, repro
from course_utils.runfolder import RunFolder
from course_utils.signals import StopSignal
from course_utils.sinks import JsonlSink, read_metrics
from tests.support.notebook_cells import ROOT

OLD_METRICS = '{"split": "train", "step": 1}\n{"split": "train", "step": 2}\n'

# each writer of a run folder: the file it rewrites and the code that rewrites it (run in `out`)
WRITERS = {
    "status": ("status.json", "from course_utils.runfolder import RunFolder\n"
                              "RunFolder.claim(out, resume=True).write_status('running', 7)"),
    "config, resumed with a change": (
        "config.json", "from course_utils.runfolder import RunFolder\n"
                       "RunFolder.claim(out, resume=True).record_changes({'hparams': {'lr': 1}}, {'lr': (1, 2)}, 3)"),
    "config, new run": ("config.json", "from course_utils.repro import dump_run_config\n"
                                       "dump_run_config(out, {'lr': 3}, 'cpu', repo=out)"),
    "metrics, rewritten on resume": ("metrics.jsonl", "from course_utils.sinks import JsonlSink\n"
                                                      "JsonlSink(out / 'metrics.jsonl', resume_step=1).close()"),
}


def _folder(tmp_path):
    """A run folder holding an old run: each file has content a broken rewrite would lose."""
    out = tmp_path / "run"
    with RunFolder.claim(out, resume=False) as run:
        run.write_status("running", 2)
    (out / "config.json").write_text(json.dumps({"hparams": {"lr": 1}}))
    (out / "metrics.jsonl").write_text(OLD_METRICS)
    return out, {p.name: p.read_bytes() for p in out.iterdir()}


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(writer, tmp_path, monkeypatch):
    out, before = _folder(tmp_path)

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        exec(WRITERS[writer][1], {"out": out})
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert after.keys() == before.keys(), "a temp file was left behind"
    assert after[WRITERS[writer][0]] == before[WRITERS[writer][0]]


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_write_killed_before_the_rename_leaves_only_what_cleanup_removes(writer, tmp_path):
    out, before = _folder(tmp_path)
    target, code = WRITERS[writer]
    killed = subprocess.run([sys.executable, "-c", "import os, signal, pathlib\n"
                             "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # killed right there\n"
                             f"out = pathlib.Path({str(out)!r})\n{code}"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (out / target).read_bytes() == before[target], "the old file must be untouched"
    left = sorted(set(p.name for p in out.iterdir()) - before.keys())
    assert left and all(durable.TEMP_FILE.match(name) for name in left), left
    with RunFolder.claim(out, resume=True) as run:
        assert sorted(p.name for p in run.remove_leftovers()) == left
    assert {p.name for p in out.iterdir()} == before.keys()


def test_config_json_is_durable_on_both_paths(tmp_path, monkeypatch):
    """The rename itself survives a power cut: the folder is fsynced after config.json is replaced."""
    synced = []
    monkeypatch.setattr(durable, "fsync_folder", synced.append)
    config = repro.dump_run_config(tmp_path, {"lr": 3}, "cpu", repo=tmp_path)
    assert synced == [tmp_path]
    with RunFolder.claim(tmp_path, resume=True) as run:
        run.record_changes(config, {"lr": (3, 2)}, 5)
    assert synced == [tmp_path, tmp_path]
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["hparams"]["lr"] == 2 and saved["history"][0]["changes"] == {"lr": [3, 2]}


def test_resumed_metrics_keep_the_records_up_to_the_resumed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(OLD_METRICS + '{"split": "tr')  # a torn last line: killed mid-append
    sink = JsonlSink(path, resume_step=1)
    sink.write({"split": "train", "step": 2, "loss": 0.5})
    sink.close()
    assert read_metrics(path) == [{"split": "train", "step": 1}, {"split": "train", "step": 2, "loss": 0.5}]


def test_stop_signal_sets_a_flag_and_a_second_ctrl_c_stops_hard():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignal() as stop:
        assert stop.requested is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested == "SIGTERM"  # the process lives on, the loop sees the flag
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before


class _WorkerView(Dataset):
    """What a DataLoader worker sees: its SIGTERM handler, whether SIGTERM is blocked, its init mark."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int):
        blocked = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        ignored = signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        return torch.tensor([ignored, blocked, os.environ.get("INIT_RAN") == "1", os.getpid()])


def _mark(worker_id: int) -> None:
    os.environ["INIT_RAN"] = "1"


@pytest.mark.skipif("fork" not in __import__("multiprocessing").get_all_start_methods(), reason="needs fork")
def test_dataloader_workers_ignore_the_stop_signals_and_run_their_own_init():
    loader = DataLoader(_WorkerView(), batch_size=1, num_workers=2, worker_init_fn=_mark,
                        multiprocessing_context="fork")
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with StopSignal() as stop:
        rows = [batch[0].tolist() for batch in stop.iterate(loader)]
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask, "the main process's mask is restored"
    assert len({pid for *_, pid in rows}) == 2 and all(pid != os.getpid() for *_, pid in rows)
    assert all(ignored and not blocked and init for ignored, blocked, init, _ in rows), rows
    plain = [batch[0].tolist() for batch in DataLoader(_WorkerView(), batch_size=1, num_workers=1,
                                                       multiprocessing_context="fork")]
    assert not plain[0][0], "without iterate() a worker keeps the default SIGTERM (the test would prove nothing)"


def test_the_run_folder_and_the_stop_signal_load_without_torch():
    """A script claims its folder, checks its config and installs the stop signal before it imports torch."""
    out = subprocess.run([sys.executable, "-c", "import sys, course_utils.runfolder, course_utils.signals; "
                          "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_the_package_docstring_names_every_module():
    listed = {line.split("``")[1] for line in course_utils.__doc__.splitlines() if line.startswith("- ``")}
    modules = {m.name for m in pkgutil.iter_modules(course_utils.__path__) if not m.name.startswith("_")}
    assert listed == modules


def test_the_course_tools_docstring_names_every_module():
    import re

    import course_tools
    listed = set(re.findall(r"``(\w+)``", course_tools.__doc__))
    modules = {m.name for m in pkgutil.iter_modules(course_tools.__path__) if not m.name.startswith("_")}
    assert modules <= listed, sorted(modules - listed)
