"""The fork server the professional script's tests start their runs with (tests/forkserver.py).

A forked run must be what ``python SCRIPT ARGS`` would be, as the tests see it: the exit status
(``sys.exit``, an uncaught exception, a signal), the output, argv, the working folder, the
environment, stdin, a new session on request, fresh ``random`` state, ``atexit`` and non-daemon
threads at the end. The professional script's own equivalence: every test that compares a forked
run with the session's shared reference run, which is a real interpreter (tests/pro_runs.py).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.forkserver import ForkServer

pytestmark = pytest.mark.slow

PROBE = '''
import atexit, os, random, sys, threading, time
mode = sys.argv[1]
if mode == "exit":
    print("out", flush=True); print("err", file=sys.stderr); sys.exit(7)
if mode == "raise":
    raise ValueError("boom")
if mode == "message":
    sys.exit("a message")
if mode == "killed":
    os.kill(os.getpid(), 9)
if mode == "sleep":
    print("ready", flush=True); time.sleep(60)
if mode == "describe":
    print(sys.argv[1:], os.getcwd(), sys.path[0], os.environ.get("PROBE_VALUE"), sys.stdin.read() == "",
          os.getsid(0) == os.getpid(), random.random(), __name__)
if mode == "end":
    atexit.register(lambda: print("atexit ran", flush=True))
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", flush=True))).start()
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("probe")
    (folder / "probe.py").write_text(PROBE, encoding="utf-8")
    found = ForkServer(folder / "probe.py")
    assert found.error is None, found.error
    return found


def output(run) -> tuple[int, str]:
    out, _ = run.communicate(timeout=30)
    return run.returncode, out


def test_exit_statuses_are_those_of_an_interpreter(server):
    assert output(server.start(["exit"])) == (7, "out\nerr\n")
    code, out = output(server.start(["raise"]))
    assert code == 1 and "Traceback" in out and "ValueError: boom" in out
    assert output(server.start(["message"])) == (1, "a message\n")
    assert output(server.start(["killed"])) == (-9, "")


def test_signals_reach_the_run_and_wait_times_out(server):
    run = server.start(["sleep"])
    assert run.stdout.readline() == "ready\n" and run.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        run.wait(0.2)
    run.send_signal(signal.SIGTERM)
    assert run.wait(10) == -signal.SIGTERM
    run.kill()  # after the end: nothing happens, as with Popen


def test_argv_folder_environment_stdin_session_and_random_state(server, tmp_path, monkeypatch):
    a = output(server.start(["describe", "x"], cwd=str(tmp_path)))[1].split()
    b = output(server.start(["describe", "x"], new_session=True))[1].split()
    assert a[:4] == ["['describe',", "'x']", str(tmp_path), str(server.script.rsplit("/", 1)[0])]
    assert a[4:7] == ["None", "True", "False"] and b[6] == "True"  # PROBE_VALUE unset; stdin empty; the session
    assert a[7] != b[7] and a[8] == "__main__"  # random reseeded in each run
    monkeypatch.setenv("PROBE_VALUE", "1")
    assert not server.usable() and server.start(["describe"]) is None  # the client starts a real process


def test_the_end_joins_threads_and_runs_atexit(server):
    assert output(server.start(["end"])) == (0, "thread done\natexit ran\n")


def test_the_runs_die_with_their_client(server):
    other = ForkServer(server.script)
    run = other.start(["sleep"])
    assert run.stdout.readline() == "ready\n"
    other.close()
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{run.pid}") and open(f"/proc/{run.pid}/stat").read().split()[2] != "Z":
        assert time.monotonic() < deadline, "the run outlived its server"
        time.sleep(0.05)
