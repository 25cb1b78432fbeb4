"""course_tools.lab.hangs (11 §10): what the notebook run does not prove by itself.

The notebook shows the frames of one real dump; here the parser meets the cases it may not see there: the
dumping thread is not the main thread (it must be skipped), a torn or empty file, and a window too long
for the hang limit (refused before any job starts).
"""
from __future__ import annotations

import faulthandler
import threading

import pytest

from course_tools.lab.hangs import freeze_rank, main_thread_frames


def _dump_from_a_thread(path) -> None:
    """Dump every thread's stack from a helper thread while the main thread waits here (as the watchdog does)."""
    def dump() -> None:
        with open(path, "w") as f:
            f.write("rank 0 pid 1: step 3, phase allreduce\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)

    helper = threading.Thread(target=dump, name="hang-watchdog")
    helper.start()
    helper.join()


def test_main_thread_frames_are_the_main_threads_not_the_dumping_threads(tmp_path):
    path = tmp_path / "stacks_rank0.txt"
    _dump_from_a_thread(path)
    frames = main_thread_frames(path.read_text())
    ours = [f for f in frames if f.startswith("tests/test_lab_hangs.py:")]  # innermost first: join, then ours
    assert [f.split(" ")[-1] for f in ours] == ["_dump_from_a_thread",
                                                "test_main_thread_frames_are_the_main_threads_not_the_dumping_threads"]
    assert not any(f.endswith((" dump", " _bootstrap_inner")) for f in frames), "the dumping thread's frames"
    assert not any(f.startswith("/") for f in frames), "no machine-specific path"


@pytest.mark.parametrize("text", ["", "rank 0 pid 1: step 3, phase data\n", "Current thread 0x1 (most recent call first):\n"
                                  '  File "/x/heartbeat.py", line 1 in end\n', "garbage\x00\n\nThread 0x2 (most"])
def test_a_torn_or_empty_dump_gives_no_frames(text):
    assert main_thread_frames(text) == []


def test_a_window_as_long_as_the_hang_limit_is_refused_before_any_job_starts():
    with pytest.raises(ValueError, match="hang_timeout"):
        freeze_rank(hang_timeout=5, settle_s=2, watch_s=2.5)
