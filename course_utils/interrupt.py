"""Run a learner's script and SIGKILL it right after its k-th optimizer step: an exact ``kill -9``.

Why: a check that watches ``metrics.jsonl`` and kills the script when step k shows up races with
it. On a busy machine the script can finish (or save several more checkpoints) before the
checking process gets the CPU back, and the verdict then depends on the load. Counting the
steps inside the script's own process removes the race: the kill comes after exactly k steps,
on any machine, at any load.

How: ``python interrupt.py [--stop] K SCRIPT ARG...`` installs an import hook, then runs ``SCRIPT`` as
``__main__`` with ``sys.argv = [SCRIPT, ARG...]`` and the script's folder first on ``sys.path``,
exactly as ``python SCRIPT ARG...`` would (same argv, ``__file__``, exit status and traceback,
with this file's frames left out). When the script imports ``torch.optim.optimizer`` (``import
torch`` does), the hook registers a global step hook with torch's public
``torch.optim.optimizer.register_optimizer_step_post_hook``; after the K-th ``optimizer.step()`` of
the process it sends the process SIGKILL (``--stop``: SIGSTOP, so that
whoever watches can kill a whole job of several processes, frozen at that step, as ``lab.multi_process``
does under torchrun). The learner's code is unchanged and sees nothing: no
flag, no environment variable. A script that never steps a ``torch.optim`` optimizer is not
stopped here; the check falls back to watching its log and says so.

Pitfall: the kill comes inside ``optimizer.step()`` of step K, before the script logs or
checkpoints step K: the log ends at step K - 1 or earlier, and a checkpoint "every 10 steps"
with K = 20 is never written.

Torch-free stand-ins of a learner's script (the test fixtures) call :func:`optimizer_stepped`
where a real script would call ``optimizer.step()``. The resume doctor
(:mod:`course_utils.resume_doctor`) records each step through the same hook before the kill.

Reference machinery of the homework checks (``course_tools/checks/homework_runs.py``) and of the resume
doctor; ``course_utils`` holds it so that a learner can run it on any script.

Example::

    subprocess.Popen([sys.executable, interrupt.__file__, "25", "train_cifar.py", "--out", "runs/x"])
    # ends with returncode -9 right after step 25
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import signal
import sys
from pathlib import Path

__all__ = ["OPTIMIZER_MODULE", "after_import", "arm", "optimizer_stepped", "run_command", "main"]

OPTIMIZER_MODULE = "torch.optim.optimizer"
_state = {"left": 0, "signal": signal.SIGKILL}  # optimizer steps before the signal; 0: not armed


def optimizer_stepped(*_: object) -> None:
    """Count one optimizer step; signal this process at the armed count (a no-op when not armed)."""
    if _state["left"] <= 0:
        return
    _state["left"] -= 1
    if _state["left"] == 0:
        for stream in (sys.stdout, sys.stderr):  # what the script printed is in its log, as after kill -9 mid-step
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os.kill(os.getpid(), _state["signal"])


def _register(module) -> None:
    module.register_optimizer_step_post_hook(optimizer_stepped)


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs ``then(module)`` once ``name`` has been imported (by whatever imports it first)."""

    def __init__(self, name: str, then) -> None:
        self.name, self.then, self.spec = name, then, None

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        self.spec = importlib.util.find_spec(fullname)
        if self.spec is None or self.spec.loader is None:
            return self.spec
        return importlib.util.spec_from_loader(fullname, self, origin=self.spec.origin,
                                               is_package=self.spec.submodule_search_locations is not None)

    def create_module(self, spec):
        return self.spec.loader.create_module(self.spec)

    def exec_module(self, module) -> None:
        module.__spec__, module.__loader__ = self.spec, self.spec.loader
        if self.spec.origin and self.spec.has_location:
            module.__file__ = self.spec.origin
        self.spec.loader.exec_module(module)
        self.then(module)


def after_import(name: str, then) -> None:
    """Call ``then(module)`` once module ``name`` is imported (at once if it already is)."""
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def arm(steps: int, sig: int = signal.SIGKILL) -> None:
    """Send this process ``sig`` right after its ``steps``-th optimizer step (torch.optim, or :func:`optimizer_stepped`)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    _state.update(left=steps, signal=sig)
    after_import(OPTIMIZER_MODULE, _register)


def _run_as_main(script: str) -> None:
    import runpy

    try:
        runpy.run_path(script, run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001  shown as `python SCRIPT` shows it, from the script's frame on
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        if tb is not None:
            exc.with_traceback(tb)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.exit(1)


def run_command(command: list[str]) -> None:
    """Run ``SCRIPT ARG...`` or ``-m MODULE ARG...`` in this process as ``python`` would run it."""
    if command[:1] == ["-m"]:
        import runpy

        sys.argv = [command[1], *command[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(command[1], run_name="__main__", alter_sys=True)
        return
    script, *args = command
    script = str(Path(script).resolve())
    sys.argv = [script, *args]
    sys.path[0] = str(Path(script).parent)
    _run_as_main(script)


def main(argv: list[str]) -> None:
    """``argv``: ``[--stop] K SCRIPT ARG...``."""
    stop = argv[:1] == ["--stop"]
    steps, *command = argv[1:] if stop else argv
    arm(int(steps), signal.SIGSTOP if stop else signal.SIGKILL)
    run_command(command)


if __name__ == "__main__":
    # Run from this file's path: import the package's copy, so that a stand-in script that imports
    # course_utils.interrupt counts on the same, armed, module.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
    from course_utils import interrupt

    interrupt.main(sys.argv[1:])
