"""A fork server for the tests' runs of Python scripts: the imports are done once, not once per run.

Why: a test-sized run of ``solutions/homework/train_cifar_pro.py`` (30 steps) spends about 3 of its
3.5 CPU-seconds importing torch and, on its first optimizer, ``torch._dynamo``
(``bench/RESULTS.md`` §5); the tests start about a hundred such runs. The homework checks' tests
run thousands of torch-free fakes and dozens of real learner scripts (``tests/support/homework_scripts``:
``FORKED``, ``FORKED_TORCH``), which spend most of their CPU time starting an interpreter.

How: the server (``python tests/support/forkserver.py FD SETUP``) imports torch (unless told not to), the
modules it is given and the script's modules (the script itself under another name, so that its
``__main__`` block does not run), then forks one child per request. The child becomes the run: its
own argv, working folder, environment, session (set before the server reports the pid, as ``Popen``
returns after the child's ``setsid``), stdin from ``/dev/null`` and stdout/stderr into the pipe or
file the test passed along; it executes the script as ``__main__`` and leaves as the interpreter
would (non-daemon threads joined, ``atexit`` run, the exit status of ``SystemExit``, 1 and a
traceback on an uncaught exception). The server reaps it and reports its exit status (negative: the
signal) to the test.

What a forked run does not share with ``python SCRIPT``: the imports (already done, so a run's
start-up is not exercised: the session's shared reference runs, every run with its own environment or
a ``preexec_fn``, and the torchrun tests start real interpreters), the hash seed of ``str`` (the
server's), and environment variables read while torch is imported (``OMP_NUM_THREADS``...): the
client uses a server only for a run whose environment is the one the server started with. ``random``
and (when imported) NumPy's global generator are reseeded from the OS in each child, as a new
interpreter seeds them.

The client side is ``ForkServer`` / ``ForkedRun`` (``tests/support/pro_runs.py`` and ``tests/support/homework_scripts.py``
use them): a ``subprocess.Popen``-like handle (``pid``, ``stdout``, ``poll``, ``wait``,
``communicate``, ``send_signal``, ``terminate``, ``kill``, ``returncode``; ``stdout`` is ``None``
when the run writes to a file the test passed).
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

MESSAGE = 1 << 20  # the largest request (argv, folder, environment) or reply, in bytes
PER_TEST = "PYTEST_CURRENT_TEST"  # pytest changes it at every test: not part of the environment compared


def environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """What a server must have started with to fork runs with ``env`` (default: this process's)."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k != PER_TEST}


# ---------------------------------------------------------------- server (its own process)

def _child(request: dict, output: int, server: socket.socket, told: int) -> None:
    """Become the run asked for (``told`` is closed once its session is set); never returns."""
    code = 1
    try:
        server.close()
        if request["new_session"]:
            os.setsid()
        os.close(told)
        for number in (signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(null)
        os.close(output)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import random
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        script = request["argv"][0]
        sys.argv = list(request["argv"])
        sys.path[0] = str(Path(script).resolve().parent)
        code = _run_as_main(script)
        threading._shutdown()  # the interpreter joins non-daemon threads before atexit
        import atexit
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001  a failure of this wrapper itself
        import traceback
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def _run_as_main(script: str) -> int:
    import runpy
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # as the interpreter ends on an uncaught Ctrl-C: killed by SIGINT
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def serve(fd: int, setup: dict) -> None:
    server = socket.socket(fileno=fd)
    import importlib
    import importlib.util

    if setup["torch"]:
        import torch  # noqa: F401
        import torch._dynamo  # noqa: F401  the first optimizer imports it
    sys.path[:0] = setup["path"]
    for name in setup["modules"]:
        importlib.import_module(name)
    if setup["script"]:
        spec = importlib.util.spec_from_file_location("forkserver_preload", setup["script"])
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)  # the script's imports; its __main__ block does not run
    # A fork copies only the calling thread: no Python thread may run here (native pools such as
    # OpenBLAS's, started by NumPy's import, handle fork themselves, as under DataLoader workers).
    if threading.active_count() != 1:  # refuse: the client starts real processes
        server.send(json.dumps({"error": f"{threading.active_count()} threads after the imports"}).encode())
        return
    server.send(json.dumps({"ready": os.getpid()}).encode())
    children: dict[int, int] = {}  # pid -> the request it answers (its pid has been sent)
    starting: dict[int, tuple[int, int]] = {}  # read end -> (pid, request): its session is not set yet

    def started(fd: int) -> None:  # the child has set its session (or died): the client may have its pid
        pid, request_id = starting.pop(fd)
        os.close(fd)
        children[pid] = request_id
        server.send(json.dumps({"id": request_id, "pid": pid}).encode())

    while True:
        # Poll (to reap a run and report its exit at once) only while one is starting or running; an idle server
        # waits for the next request. A server lives as long as its test process, mostly idle: polling every 5 ms
        # then cost 0.8% of a core per server, for nothing.
        readable, _, _ = select.select([server, *starting], [], [], 0.005 if children or starting else None)
        for fd in readable:
            if fd in starting:
                started(fd)
        if server in readable:
            message, fds, _, _ = socket.recv_fds(server, MESSAGE, 1)
            if not message:  # the client is gone: its runs go with it
                for pid in [*children, *(pid for pid, _ in starting.values())]:
                    os.kill(pid, signal.SIGKILL)
                return
            request = json.loads(message)
            sys.stdout.flush()
            sys.stderr.flush()
            ready, told = os.pipe()
            pid = os.fork()
            if pid == 0:
                for fd in (ready, *starting):
                    os.close(fd)
                _child(request, fds[0], server, told)
            os.close(told)
            os.close(fds[0])
            starting[ready] = (pid, request["id"])  # answered when the child closes ``told``, not waited for here
        while children or starting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            for fd in [fd for fd, (waiting, _) in starting.items() if waiting == pid]:
                started(fd)  # the pid before the exit status
            request_id = children.pop(pid)
            server.send(json.dumps({"id": request_id, "code": os.waitstatus_to_exitcode(status)}).encode())


# ---------------------------------------------------------------- client (the test process)

class ForkedRun:
    """A run forked by the server: what the tests use of ``subprocess.Popen`` (text-mode stdout, stderr in it)."""

    def __init__(self, args: list[str], stdout_fd: int | None) -> None:
        self.args, self.pid, self.returncode = args, None, None
        self.stdout = None if stdout_fd is None else open(stdout_fd, "r")
        self._started, self._exited, self._code = threading.Event(), threading.Event(), None
        self._reader: threading.Thread | None = None
        self._output = ""

    def _forked(self, pid: int) -> None:
        self.pid = pid
        self._started.set()

    def _finished(self, code: int) -> None:
        self._code = code
        self._exited.set()

    def poll(self) -> int | None:
        if self._exited.is_set():
            self.returncode = self._code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.poll()

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        """Read stdout to its end, then wait; on ``TimeoutExpired`` a later call returns the whole output."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdout is None:  # the output went to the test's file
            self.wait(timeout)
            return None, None
        if self._reader is None:
            self._reader = threading.Thread(target=self._drain, daemon=True)
            self._reader.start()
        self._reader.join(timeout)
        if self._reader.is_alive():
            raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._output, None

    def _drain(self) -> None:
        self._output = self.stdout.read()
        self.stdout.close()

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, number)
            except ProcessLookupError:  # ended, its exit status on the way: as Popen, nothing to do
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """One server per test process, script and environment; ``start`` forks a run (``None``: use a real process).

    ``script`` is what ``start`` runs unless told another; ``modules`` (found on ``path``) are imported
    besides it; ``torch=False`` for a server of torch-free scripts; ``env``: the environment of the
    server and of every run it forks (default: this process's).
    """

    def __init__(self, script: Path | None, *, modules: tuple[str, ...] = (), path: tuple[Path, ...] = (),
                 torch: bool = True, env: dict[str, str] | None = None) -> None:
        self.script = None if script is None else str(script)
        self.env = environment(env)
        setup = {"script": self.script, "modules": list(modules), "path": [str(p) for p in path], "torch": torch}
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._process = subprocess.Popen([sys.executable, __file__, str(theirs.fileno()), json.dumps(setup)],
                                         pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, env=env)
        theirs.close()
        hello = json.loads(self._socket.recv(MESSAGE) or b'{"error": "the server ended"}')
        self.error = hello.get("error")
        self._lock = threading.Lock()
        self._runs: dict[int, ForkedRun] = {}  # request id -> its run, until the run has ended
        self._next = 0
        if self.error is None:
            threading.Thread(target=self._listen, daemon=True).start()

    def usable(self, env: dict[str, str] | None = None) -> bool:
        """Whether a run with ``env`` (default: this process's environment) can be forked."""
        return self.error is None and self._process.poll() is None and environment(env) == self.env

    def close(self) -> None:
        """End the server and the runs it forked (as the end of the test process does)."""
        self._socket.shutdown(socket.SHUT_RDWR)  # wakes the listening thread; the server sees the end
        self._socket.close()
        self._process.wait(30)

    def start(self, args: list[str], cwd: str | None = None, new_session: bool = False, *,
              script: str | None = None, env: dict[str, str] | None = None,
              stdout: int | None = None) -> ForkedRun | None:
        """Fork ``python SCRIPT ARGS``; its output goes to a pipe (``run.stdout``) or the open file ``stdout``.
        Inside :func:`fresh_only` (a test marked ``fresh_interpreter``) this raises instead."""
        if FRESH_ONLY:
            raise RuntimeError(f"{FRESH_ONLY[-1]} is marked fresh_interpreter, but this run would be forked: "
                               "start it with interpreter='fresh' (or the checks' LOCAL launcher)")
        if not self.usable(env):
            return None
        if stdout is None:
            read_end, write_end = os.pipe()
        else:
            read_end, write_end = None, stdout
        argv = [script or self.script, *args]
        run = ForkedRun([sys.executable, *argv], read_end)
        with self._lock:
            self._next += 1
            request_id = self._next
            self._runs[request_id] = run
        request = {"id": request_id, "argv": argv, "cwd": cwd or os.getcwd(),
                   "env": dict(os.environ if env is None else env), "new_session": new_session}
        try:
            socket.send_fds(self._socket, [json.dumps(request).encode()], [write_end])
        finally:
            if stdout is None:
                os.close(write_end)
        if not run._started.wait(30):
            if run.stdout is not None:
                run.stdout.close()
            raise RuntimeError("the fork server did not answer within 30 s")
        return run

    def _listen(self) -> None:
        while True:
            try:
                message = self._socket.recv(MESSAGE)
            except OSError:  # closed by close() after its shutdown woke us
                return
            if not message:
                return
            reply = json.loads(message)
            with self._lock:
                run = self._runs[reply["id"]] if "pid" in reply else self._runs.pop(reply["id"])
            if "pid" in reply:  # forked (always before its exit: the server reaps after it answers)
                run._forked(reply["pid"])
            else:
                run._finished(reply["code"])


FRESH_ONLY: list[str] = []  # the tests running now that may start real interpreters only (fresh_only)


@contextmanager
def fresh_only(test: str) -> Iterator[None]:
    """While the block runs, every forked start raises: ``test`` (a test id) is about a real interpreter's start-up,
    imports or environment, which a forked run skips. tests/conftest.py wraps each test marked
    ``fresh_interpreter`` in it."""
    FRESH_ONLY.append(test)
    try:
        yield
    finally:
        FRESH_ONLY.remove(test)


_SHARED: dict[tuple, ForkServer] = {}  # this process's servers, one per setup and environment
_SHARED_LOCK = threading.Lock()  # checks start runs from several threads


def shared_server(script: Path | None, *, modules: tuple[str, ...] = (), path: tuple[Path, ...] = (),
                  torch: bool = True, env: dict[str, str] | None = None) -> ForkServer:
    """This process's server for that setup and environment (``ForkServer``'s arguments), started on first use."""
    key = (str(script), tuple(modules), tuple(str(p) for p in path), torch, frozenset(environment(env).items()))
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = ForkServer(script, modules=modules, path=path, torch=torch, env=env)
        return _SHARED[key]


if __name__ == "__main__":
    serve(int(sys.argv[1]), json.loads(sys.argv[2]))
