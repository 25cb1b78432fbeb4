"""The bubblewrap mounts and environment of a sandbox: what learner code can see.

The root is an empty tmpfs, remounted read-only, with only :func:`readonly_paths` bound read-only: ``/usr``, a few
files of ``/etc`` (no ``shadow``, no keys), Python, the venv and the course packages the GRADER imported.
Writable: size-capped tmpfs ``/scratch``, ``/tmp``, ``/dev/shm``, ``$HOME`` and the host paths the caller names.
The environment is :func:`kernel_env` alone; its ``PYTHONPATH`` names the grader's own packages (an editable
install may point at another checkout, which is not mounted).

Example::

    args = bwrap_args(Limits(), kernel_env(SANDBOX_HOME, "/tmp"), writable=[run_folder])
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from course_tools.noninteractive import quiet_environ
from course_grader.sandbox.procs import Limits

__all__ = ["SANDBOX_CWD", "SANDBOX_HOME", "course_packages", "package_roots", "readonly_paths", "kernel_env",
           "bwrap_args"]

SANDBOX_CWD = "/scratch"
SANDBOX_HOME = "/home/learner"

# Files of /etc a Python process needs; everything else there (shadow, ssh keys, ...) stays hidden.
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "fonts", "passwd", "group", "nsswitch.conf",
        "localtime", "mime.types", "os-release", "hosts")


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def course_packages() -> list[Path]:
    """The folders of the two course packages this (grader) process imported."""
    import course_tools
    import course_utils

    return [Path(m.__file__).resolve().parent for m in (course_utils, course_tools)]


@functools.lru_cache(maxsize=None)
def package_roots() -> tuple[Path, ...]:
    """The folders holding the course packages this (grader) process imported: ``PYTHONPATH`` inside."""
    return tuple(dict.fromkeys(p.parent for p in course_packages()))


@functools.lru_cache(maxsize=None)
def readonly_paths() -> tuple[Path, ...]:
    """Host paths bound read-only into the sandbox, outermost first, none inside another."""
    wanted = [Path("/usr")] + [Path("/etc") / name for name in _ETC]
    wanted += [Path(p) for p in {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix}]
    wanted += course_packages()
    chosen: list[Path] = []
    for path in sorted({p.resolve() for p in wanted if p.exists()}, key=lambda p: len(p.parts)):
        if not _under(path, chosen):
            chosen.append(path)
    return tuple(chosen)


def kernel_env(home: str, tmp: str, threads: int = 0) -> dict[str, str]:
    """The whole environment of a graded kernel: nothing inherited from the instructor's shell."""
    env = quiet_environ({}, override=True)  # COURSE_FAST=1, wandb offline
    env.update({"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
                "HOME": home, "TMPDIR": tmp, "IPYTHONDIR": os.path.join(tmp, ".ipython"), "LANG": "C.UTF-8",
                "LC_ALL": "C.UTF-8",
                "MPLBACKEND": "module://matplotlib_inline.backend_inline", "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONNOUSERSITE": "1", "JUPYTER_PLATFORM_DIRS": "1",
                "PYTHONPATH": os.pathsep.join(str(p) for p in package_roots())})
    if threads:
        env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
    return env


def bwrap_args(limits: Limits, env: dict[str, str], writable: list[Path], readable: tuple[Path, ...] = (),
                cwd: str = SANDBOX_CWD, scripts: tuple[Path, ...] = ()) -> list[str]:
    """bwrap's options for one sandbox: the mounts (``writable`` read-write, ``readable`` read-only, each of
    ``scripts`` a private tmpfs of its files read-only), ``env`` as the whole environment, ``cwd`` inside."""
    # The tmpfs mounts come first: a virtual environment or a grader folder under /tmp is bound on top.
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
            "--dev", "/dev", "--size", str(limits.shm), "--tmpfs", "/dev/shm", "--proc", "/proc",
            "--size", str(limits.tmp), "--tmpfs", "/tmp",
            "--size", str(limits.home), "--tmpfs", SANDBOX_HOME,
            "--size", str(limits.scratch), "--tmpfs", SANDBOX_CWD]
    for path in readonly_paths():
        args += ["--ro-bind", str(path), str(path)]
    for top in ("bin", "lib", "lib32", "lib64", "sbin"):  # merged /usr: /bin -> usr/bin ...
        link = Path("/") / top
        if link.is_symlink():
            args += ["--symlink", os.readlink(link), str(link)]
        elif link.is_dir() and not _under(link, list(readonly_paths())):
            args += ["--ro-bind", str(link), str(link)]
    for path in readable:
        args += ["--ro-bind", str(path), str(path)]
    for folder in scripts:  # a private tmpfs at the folder's path, its entries bound read-only into it
        args += ["--size", str(limits.tmp), "--tmpfs", str(folder)]
        for entry in sorted(Path(folder).iterdir()):
            args += ["--ro-bind", str(entry), str(entry)]
    for path in writable:
        args += ["--bind", str(path), str(path)]
    args += ["--chdir", cwd,
             "--remount-ro", "/dev", "--remount-ro", "/"]  # the root tmpfs itself: no writes outside the above
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args
