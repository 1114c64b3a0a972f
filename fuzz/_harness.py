"""What every atheris target shares: optional instrumentation, the libFuzzer entry, tmp paths.

A target module defines ``TestOneInput(data: bytes) -> None`` and ends with
``if __name__ == "__main__": harness.fuzz(TestOneInput)``. Imported by the regression
tests, a target is plain Python: atheris is neither needed nor imported, and nothing
is instrumented.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["ROOT", "fuzz", "instrumented", "scratch_path", "write_scratch"]

ROOT = Path(__file__).resolve().parent.parent
"""The repository root (targets read test data from it)."""


@contextlib.contextmanager
def instrumented(enabled: bool, packages: list[str]) -> Iterator[None]:
    """Instrument the modules of ``packages`` imported inside the block when ``enabled``.

    Only the project's own packages are instrumented: NumPy and the standard library
    would slow every execution down for coverage that is not ours.
    """
    if not enabled:
        yield
        return
    import atheris

    with atheris.instrument_imports(include=packages):
        yield


def scratch_path(target: str, suffix: str) -> str:
    """A temporary file path for this process: ``<tmp>/kael-<target>-<pid><suffix>``.

    The process id keeps parallel fuzzers (and pytest-xdist workers) from sharing a file.
    `<tmp>` is /dev/shm where it exists (memory: a file per execution costs microseconds
    there, milliseconds on a disk), else the system's temporary directory.
    """
    shm = "/dev/shm"
    folder = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()
    return os.path.join(folder, f"kael-{target}-{os.getpid()}{suffix}")


def write_scratch(path: str, data: bytes) -> None:
    """Make `path` hold `data`: written beside it, then renamed over it.

    A mapping of the old file that is still alive keeps the old file, and creating a new
    file is much faster here than truncating one that exists.
    """
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def fuzz(test_one_input: Callable[[bytes], None]) -> None:
    """Hand ``test_one_input`` to libFuzzer with this process's command line."""
    import atheris

    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
