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

Verified files (checkpoints): :func:`save_verified` streams ``torch.save`` through the atomic
write and hashes every byte on its way to the file (one pass, no copy), then writes the checksum
beside it (``step_10.pt.sha256``: ``xxh3_128:<hex>  step_10.pt``). :func:`load_verified` hashes
the open file and returns what ``torch.load`` read from that same file only if the digest matches
(the two run side by side, so a resume pays no extra time for the check). The hash guards
against corruption (a half-copied file, a flipped bit), not forgery: whoever can change the file
can change its checksum too; ``weights_only=True`` is the guard against a malicious payload. So it
need not be cryptographic: xxh3-128 hashes about 10x faster than SHA-256 (``bench/checkpoint_cost.py``),
cheap enough to compute in line. Sidecars of older checkpoints hold a bare SHA-256 hex digest;
they still verify. The sidecar keeps its historical ``.sha256`` name: retention, leftover
cleanup and every run folder written so far know it by that name.

Only the standard library is imported at import time (``runfolder`` uses this module before a
script imports torch); torch and xxhash are imported only when a verified file is written or read.

Taught in ``04_checkpoint_resume`` §5 (the atomic write, checksums); used by ``checkpoint``,
``runfolder``, ``sinks`` and ``repro``.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import mmap
import os
import re
import threading
from pathlib import Path
from typing import Any, Iterator

__all__ = ["TEMP_FILE", "temp_name", "atomic_file", "write_all", "atomic_write_bytes", "atomic_write_text",
           "atomic_write_json", "fsync_folder", "HASH", "CorruptCheckpointError", "sidecar", "write_sidecar",
           "read_sidecar", "file_digest", "save_verified", "load_verified"]

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


# ---------------------------------------------------------------- verified files (checkpoints)
HASH = "xxh3_128"
"""The hash new sidecars name; older sidecars (a bare hex digest) are ``sha256``."""


def _hasher(algorithm: str) -> Any:
    """A fresh hash object for ``algorithm`` ("xxh3_128" or "sha256"); ValueError for any other name."""
    if algorithm == "xxh3_128":
        import xxhash  # not at the top: this module imports only the standard library
        return xxhash.xxh3_128()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"未知的校验算法 {algorithm!r}")


class CorruptCheckpointError(RuntimeError):
    """A checkpoint whose checksum is missing or does not match, or that ``torch.load`` cannot read."""


def sidecar(path: str | os.PathLike) -> Path:
    """The checksum file beside ``path``: ``<name>.sha256``."""
    path = Path(path)
    return path.with_name(path.name + ".sha256")


def write_sidecar(path: str | os.PathLike, digest: str) -> None:
    """Write ``<digest>  <name>`` (``digest`` as :func:`file_digest` returns it) beside ``path``, atomically."""
    atomic_write_text(sidecar(path), f"{digest}  {Path(path).name}\n")


def read_sidecar(path: str | os.PathLike) -> str:
    """The digest recorded beside ``path`` as ``"<algorithm>:<hex>"``; a bare hex digest (older sidecars) is SHA-256.

    Raises ``OSError`` when there is no sidecar and ``ValueError`` when it names no known hash.
    """
    words = sidecar(path).read_text(encoding="utf-8").split()
    if not words:
        raise ValueError("校验和文件是空的")
    algorithm, _, hexdigest = words[0].rpartition(":")
    algorithm = algorithm or "sha256"
    _hasher(algorithm)  # ValueError for an unknown name
    return f"{algorithm}:{hexdigest.lower()}"


def file_digest(file: io.IOBase, algorithm: str = HASH) -> str:
    """``"<algorithm>:<hex>"`` of an open file, in one call over a read-only mapping of it (no copy)."""
    hasher = _hasher(algorithm)
    if os.fstat(file.fileno()).st_size > 0:  # mmap refuses an empty file
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
            hasher.update(view)
    return f"{algorithm}:{hasher.hexdigest()}"


class _HashingFile:
    """What ``torch.save`` writes to: every byte goes to ``file`` and into ``hasher``, in file order.

    ``torch.save`` hands over each tensor's bytes as a view valid only during the call: it is
    hashed right there, after the write. ``torch.save`` turns an error raised here into a
    ``RuntimeError`` without the cause; the first one is kept in ``error``.
    """

    def __init__(self, file: io.FileIO, hasher: Any) -> None:
        self.file, self.hasher, self.error = file, hasher, None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        try:
            n = write_all(self.file, view)
        except BaseException as exc:
            self.error = exc
            raise
        self.hasher.update(view)
        return n

    def flush(self) -> None:
        """Nothing to flush: every ``write`` went straight to the file."""


def save_verified(state: Any, path: str | os.PathLike) -> str:
    """``torch.save`` ``state`` atomically to ``path``, hashed on the way, and write its sidecar; return the digest.

    A failed write (a full disk) raises that ``OSError``, naming ``path``; the old ``path`` and
    its sidecar are untouched.
    """
    import torch  # not at the top: this module imports only the standard library

    path = Path(path)
    with atomic_file(path) as file:
        writer = _HashingFile(file, _hasher(HASH))
        try:
            torch.save(state, writer)
        except Exception:
            if writer.error is not None:  # the real cause, not torch's "unexpected pos"
                raise writer.error from None
            raise
    digest = f"{HASH}:{writer.hasher.hexdigest()}"
    write_sidecar(path, digest)
    return digest


def load_verified(path: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """``torch.load(weights_only=True)`` of ``path`` if it matches its sidecar; else ``CorruptCheckpointError``.

    One open file is hashed (in a thread: xxhash releases the GIL) while ``torch.load`` reads it,
    and the loaded object is returned only once the digest matches, so what is returned is what
    was verified (even if ``path`` is replaced meanwhile). The unpickler sees the bytes before the
    verdict: ``weights_only=True`` is what guards against a malicious payload (see the module's
    docstring), and anything loaded from a damaged file is dropped. Raises
    ``CorruptCheckpointError`` for a missing or unreadable sidecar, a mismatch (a truncated or
    damaged file), or a file whose digest matches but that ``torch.load`` cannot read.
    """
    import torch  # not at the top: this module imports only the standard library

    path = Path(path)
    try:
        expected = read_sidecar(path)
        file = open(path, "rb")
    except (OSError, ValueError) as exc:
        raise CorruptCheckpointError(f"{path.name}: 文件或校验和缺失 ({exc})") from exc
    with file:
        digest: list[str | Exception] = []
        hashing = threading.Thread(target=_digest_into, args=(file, expected.partition(":")[0], digest))
        hashing.start()
        try:
            loaded, failure = torch.load(file, map_location=map_location, weights_only=True), None
        except Exception as exc:
            loaded, failure = None, exc
        finally:
            hashing.join()
    if isinstance(digest[0], Exception):
        raise CorruptCheckpointError(f"{path.name}: 无法读取 ({digest[0]})") from digest[0]
    if digest[0] != expected:
        raise CorruptCheckpointError(f"{path.name}: 校验和不符(文件损坏或只写了一半)")
    if failure is not None:
        raise CorruptCheckpointError(f"{path.name}: 无法加载 ({type(failure).__name__}: {failure})") from failure
    return loaded


def _digest_into(file: io.IOBase, algorithm: str, out: list) -> None:
    try:
        out.append(file_digest(file, algorithm))
    except Exception as exc:  # noqa: BLE001  an unreadable file: reported by load_verified
        out.append(exc)
