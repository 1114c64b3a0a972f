"""Atomic file writes: write a temporary file beside the target, fsync it, rename it over.

A reader sees either the old file or the complete new one, never half of it; a write
that fails (or is interrupted) removes its temporary file and leaves the target as it
was. The temporary file lives in the target's directory so the final `os.replace` is a
rename within one file system.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

__all__ = ["atomic_write"]


def _umask() -> int:
    # Read without changing it where possible: os.umask(x) briefly changes the process's
    # umask, which would race with other threads creating files.
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(directory: str) -> None:
    # Makes the rename itself durable; not possible everywhere (e.g. Windows), so best effort.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Yield a binary file that replaces `path` only if the `with` body completes.

    The new file gets the permissions an ordinary `open(path, "wb")` would give it
    (0o666 less the umask). If `path` is a symbolic link, the link itself is replaced.
    """
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
