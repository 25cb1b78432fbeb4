"""A fresh interpreter that may not touch the network, and a record of everything it tried (issue 54).

``refusing_env(folder)`` writes a ``sitecustomize.py`` that every Python process started with the returned
environment imports first (children too: the variables are inherited). It records every ``connect`` /
``connect_ex`` of a socket that is not AF_UNIX and every ``getaddrinfo`` name lookup in ``NET_LOG``, and
refuses them; a library that tries anything leaves a line there, so "nothing was tried" is
``attempts(log) == []``. The function first proves the recorder works: a fresh interpreter's connect to
127.0.0.1 must show up in the log (otherwise an unused hook would pass every test).

Example::

    env, log = refusing_env(tmp_path)
    subprocess.run([sys.executable, "train.py"], env=env)
    assert attempts(log) == []
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HOOK = '''
import os, socket
def _record(what):
    with open(os.environ["NET_LOG"], "a") as log:
        log.write(f"{os.getpid()} {what}\\n")
def _refused(orig):
    def call(self, address, *args):
        if self.family == socket.AF_UNIX:
            return orig(self, address, *args)
        _record(f"{orig.__name__} {address!r}")
        raise OSError(101, "network refused by the test")
    return call
socket.socket.connect = _refused(socket.socket.connect)
socket.socket.connect_ex = _refused(socket.socket.connect_ex)
def _no_lookup(host, *args, **kwargs):
    _record(f"getaddrinfo {host!r}")
    raise socket.gaierror(socket.EAI_NONAME, "name lookup refused by the test")
socket.getaddrinfo = _no_lookup
'''


def refusing_env(folder: Path) -> tuple[dict[str, str], Path]:
    """This process's environment plus the hook (``folder/refuse_network`` first on ``PYTHONPATH``) and its log."""
    hook = folder / "refuse_network"
    hook.mkdir(parents=True, exist_ok=True)
    (hook / "sitecustomize.py").write_text(HOOK)
    log = folder / "network_attempts.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
           "NET_LOG": str(log)}
    control = subprocess.run([sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 9), 1)"],
                             env=env, capture_output=True, text=True)
    assert control.returncode != 0 and "127.0.0.1" in "".join(attempts(log)), "the recorder must see a connect"
    log.unlink()
    return env, log


def attempts(log: Path) -> list[str]:
    """What the processes tried: one line per connect or lookup (none: the log was never written)."""
    return log.read_text().splitlines() if log.exists() else []
