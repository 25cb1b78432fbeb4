"""The fork server the professional script's tests start their runs with (tests/support/forkserver.py).

A forked run must be what ``python SCRIPT ARGS`` would be, as the tests see it: the exit status
(``sys.exit``, an uncaught exception, a signal), the output, argv, the working folder, the
environment, stdin, a new session on request, fresh ``random`` state, ``atexit`` and non-daemon
threads at the end. The professional script's own equivalence: every test that compares a forked
run with the session's shared reference run, which is a real interpreter (tests/support/pro_runs.py).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.forkserver import ForkServer

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
    run.stdout.close()


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
    stat = Path(f"/proc/{run.pid}/stat")
    while stat.exists() and stat.read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the run outlived its server"
        time.sleep(0.05)
    run.stdout.close()


def test_a_torch_free_server_forks_any_script_with_its_environment_into_a_file(tmp_path, monkeypatch):
    # what tests/support/homework_scripts.FORKED uses: the fakes preloaded once, each run in its own session
    (tmp_path / "preloaded.py").write_text(f"open({str(tmp_path / 'imports')!r}, 'a').write('x')\n", encoding="utf-8")
    script = tmp_path / "other.py"
    script.write_text("import os, sys, time, preloaded\n"
                      "print(os.environ['PROBE_VALUE'], 'torch' in sys.modules, os.getsid(0) == os.getpid(), flush=True)\n"
                      "time.sleep(0.5)\n", encoding="utf-8")
    env = {**os.environ, "PROBE_VALUE": "2"}
    server = ForkServer(None, modules=("preloaded",), path=(tmp_path,), torch=False, env=env)
    assert server.error is None, server.error
    for k in range(2):
        with open(tmp_path / f"log{k}", "w", encoding="utf-8") as log:
            run = server.start([], new_session=True, script=str(script), env=env, stdout=log.fileno())
            assert os.getpgid(run.pid) == run.pid  # the session is set by the time start returns (killpg works)
            assert run.stdout is None and run.communicate(30) == (None, None) and run.returncode == 0
        assert (tmp_path / f"log{k}").read_text(encoding="utf-8") == "2 False True\n"
    assert (tmp_path / "imports").read_text(encoding="utf-8") == "x"  # imported by the server, not by each run
    assert server.start([], script=str(script)) is None  # this process's environment is not the server's
    monkeypatch.setenv("PROBE_VALUE", "2")
    assert server.usable()  # it is now (PYTEST_CURRENT_TEST aside)
    server.close()


@pytest.mark.fresh_interpreter
def test_a_test_marked_fresh_interpreter_cannot_fork_a_run(server, tmp_path):
    """The mark (tests/conftest.py) makes every forked start in the test raise, the professional script's and the
    homework checks' launchers included; a real interpreter still starts."""
    from tests.support.homework_scripts import FORKED
    from tests.support.pro_runs import finish, start

    with pytest.raises(RuntimeError, match="marked fresh_interpreter"):
        server.start(["exit"])
    with pytest.raises(RuntimeError, match="marked fresh_interpreter"):
        start(tmp_path / "forked", "--help", interpreter="forked")
    (tmp_path / "script.py").write_text("pass\n", encoding="utf-8")
    with open(tmp_path / "log", "w") as log, pytest.raises(RuntimeError, match="marked fresh_interpreter"):
        FORKED([sys.executable, str(tmp_path / "script.py")], cwd=tmp_path, env=dict(os.environ), stdout=log,
               writable=tmp_path)
    code, output = finish(start(tmp_path / "fresh", "--help", interpreter="fresh"), 120)
    assert code == 0 and "--accum-steps" in output, output


@pytest.fixture(scope="module")
def forked_in_setup(server) -> str:
    """What forking says while a marked test's module-scoped fixture is set up."""
    try:
        server.start(["exit"]).communicate(30)
    except RuntimeError as exc:
        return str(exc)
    return "forked"


@pytest.mark.fresh_interpreter
def test_the_mark_covers_the_fixtures_a_marked_test_sets_up(forked_in_setup):
    assert "marked fresh_interpreter" in forked_in_setup
