"""Durable file writes: a reader sees the old file or the whole new one, never half of one.

A run killed in the middle of ``open(path, "w").write(...)`` leaves a truncated file, and the
next run that reads it (a checkpoint, ``config.json``, ``status.json``) crashes or, worse, trusts
it. The one safe pattern, used by every file the course writes:

1. write into a temp file in the SAME folder (``.<name>.tmp-<pid>``: ``os.replace`` is only
   atomic within one file system, and the hidden name is what leftover cleanup looks for);
2. ``fsync`` the temp file (its bytes are on disk, not only in the page cache);
3. ``os.replace(tmp, path)`` (atomic: no moment where ``path`` is missing or partial);
4. ``fsync`` the folder (the rename itself survives a power cut).

On any error the temp file is removed and ``path`` is untouched. Pitfall: a fixed temp name
(``config.json.tmp``) is shared by two processes writing at once and is not recognised as a
leftover; always use :func:`temp_name`.

Example::

    atomic_write_json(out / "config.json", {"seed": 0})
    with atomic_file(out / "big.bin") as f:   # stream into it
        write_all(f, payload)

Taught in ``04_checkpoint_resume`` §2 (the atomic write); used by ``checkpoint``, ``runfolder``,
``monitor`` and ``repro``.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator

__all__ = ["TEMP_FILE", "temp_name", "atomic_file", "write_all", "atomic_write_bytes", "atomic_write_text",
           "atomic_write_json", "fsync_folder"]

TEMP_FILE = re.compile(r"^\..+\.tmp-\d+$")
"""The names :func:`temp_name` makes: what a killed writer may leave behind."""


def temp_name(path: Path) -> Path:
    """The temp file beside ``path`` that this process writes before the rename."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def fsync_folder(folder: Path) -> None:
    """Make a rename or unlink in ``folder`` durable (best effort: some file systems refuse)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[io.FileIO]:
    """An unbuffered temp file to write into; on success it becomes ``path`` (steps 2–4 above).

    On any error the temp file is removed, and an ``OSError`` without a file name (a failed
    ``write`` names none) is re-raised naming ``path``.
    """
    path = Path(path)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb", buffering=0) as f:
            yield f
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def write_all(file: io.FileIO, data: Any) -> int:
    """Write every byte of ``data`` to an unbuffered file (one raw ``write`` may write only part)."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += file.write(view[done:])
    return len(view)


def atomic_write_bytes(path: str | os.PathLike, payload: bytes) -> None:
    """Replace ``path`` by ``payload`` atomically and durably."""
    with atomic_file(path) as f:
        write_all(f, payload)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Replace ``path`` by ``text`` (UTF-8) atomically and durably."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Replace ``path`` by ``obj`` as indented JSON (non-ASCII kept readable) atomically and durably."""
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
