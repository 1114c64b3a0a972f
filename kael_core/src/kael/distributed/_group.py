"""The process group: MPI's world communicator, this process's rank, the collective timeout.

``init()`` imports mpi4py (lazily: ``import kael.distributed`` works without it), takes
``MPI.COMM_WORLD`` and installs the fault handling below. Before ``init()`` (or without
``mpiexec``) the world is one process: rank 0 of 1, and every collective is an identity.

NOTE [distributed faults]: MPI collectives block until every rank has joined, so one rank
that stops early would leave the others waiting forever. Two mechanisms bound that wait:

* ``sys.excepthook``: an exception that no one catches prints its traceback as usual, flushes
  it, and leaves with ``os._exit(1)`` without ``MPI_Finalize``, which makes ``mpiexec`` end every
  rank. (Not ``MPI_Abort``: that kills the job's stdio forwarding with it, and the traceback
  could reach the terminal cut off; an exiting process's pipes are read to the end.) Without
  it the failed rank would sit in ``MPI_Finalize`` (mpi4py finalizes at exit) while the others
  sit in their collective: a hang, found by trying it with MPICH. A rank that dies outright
  (a signal, ``os._exit``) is cleaned up by ``mpiexec`` itself.
* A deadline on every collective: each one is started non-blocking (``Iallreduce``, ``Ibcast``,
  ``Iallgather``, ``Ibarrier``) and its request polled with ``Test()`` until it completes or
  ``timeout`` seconds pass; then ``DistributedError`` names the op, the rank and the timeout.
  This covers what the hook cannot see: a rank that hangs, exits with ``sys.exit(n)`` while
  the others wait, or calls a different collective. Uncaught, that error aborts the job too.

After a DistributedError the group is unusable (a collective is half done); let it propagate,
or call ``abort()``.
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import Any

from .._errors import KaelError

__all__ = [
    "DistributedError",
    "abort",
    "get_rank",
    "get_world_size",
    "init",
    "is_initialized",
    "rank",
    "wait",
    "world_size",
]

DEFAULT_TIMEOUT = 600.0  # seconds; KAEL_DISTRIBUTED_TIMEOUT or init(timeout=) override it


class DistributedError(KaelError):
    """A distributed operation failed: MPI missing, a collective timed out, ranks disagree."""


DistributedError.__module__ = "kael.distributed"  # its public home, in tracebacks


class _Group:
    """The world: mpi4py's MPI module and COMM_WORLD once init() ran, else a world of one."""

    __slots__ = ("MPI", "comm", "rank", "size", "timeout")

    def __init__(self) -> None:
        self.MPI: Any = None
        self.comm: Any = None
        self.rank = 0
        self.size = 1
        self.timeout = DEFAULT_TIMEOUT


GROUP = _Group()


def _timeout_from_env() -> float:
    raw = os.environ.get("KAEL_DISTRIBUTED_TIMEOUT")
    if raw is None or raw == "":
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise DistributedError(f"KAEL_DISTRIBUTED_TIMEOUT must be a positive number of seconds, got {raw!r}")
    return value


def init(timeout: float | None = None) -> None:
    """Join the job ``mpiexec`` started: take MPI's world communicator, this rank and the world size.

    ``timeout`` (seconds; default ``KAEL_DISTRIBUTED_TIMEOUT`` or 600) bounds every collective, and an
    uncaught exception on any rank aborts the whole job (NOTE [distributed faults]). Without ``mpiexec``
    the world is one process. Calling it again only updates the timeout.
    """
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise DistributedError(f"init: timeout must be a positive number of seconds, got {timeout!r}")
    GROUP.timeout = float(timeout) if timeout is not None else _timeout_from_env()
    if GROUP.comm is not None:
        return
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise DistributedError(
            f"init: kael.distributed needs mpi4py and an MPI library ({exc}); install them with "
            "`pip install mpi4py mpich` (or `pip install 'kael-core[mpi]'`)"
        ) from None
    GROUP.MPI = MPI
    GROUP.comm = MPI.COMM_WORLD
    GROUP.rank = int(GROUP.comm.Get_rank())
    GROUP.size = int(GROUP.comm.Get_size())
    if GROUP.size > 1:
        _install_excepthook()


def _install_excepthook() -> None:
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        try:
            previous(kind, value, tb)
            sys.stderr.write(f"kael.distributed: rank {GROUP.rank} failed; aborting all {GROUP.size} ranks\n")
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            # not MPI_Abort: it has mpiexec kill every process at once, the forwarding of this rank's
            # stdio included, so the traceback just written could arrive cut off. Exiting without
            # MPI_Finalize closes our pipes (mpiexec reads them to the end) and mpiexec then ends the
            # other ranks as it does for any process that exits before finalizing.
            os._exit(1)

    sys.excepthook = hook


def is_initialized() -> bool:
    """Whether init() has joined an MPI job (of any size)."""
    return GROUP.comm is not None


def rank() -> int:
    """This process's rank, 0 .. world_size() - 1 (0 before init())."""
    return GROUP.rank


def world_size() -> int:
    """The number of processes in the job (1 before init())."""
    return GROUP.size


get_rank = rank  # PyTorch's names
get_world_size = world_size


def abort(code: int = 1) -> None:
    """End every rank of the job now with exit status ``code`` (``MPI_Abort``); a plain exit without MPI."""
    sys.stdout.flush()
    sys.stderr.flush()
    if GROUP.comm is not None:
        GROUP.comm.Abort(code)
    os._exit(code)


def wait(request: Any, op: str) -> None:
    """Poll an MPI request until it completes; DistributedError after the group's timeout.

    Polling (rather than ``Wait()``) keeps the deadline; the sleep between polls grows to 1 ms so
    a rank that waits long leaves the CPU to the others (MPICH's own wait spins).
    """
    if request.Test():
        return
    deadline = time.monotonic() + GROUP.timeout
    pause = 0.0
    while not request.Test():
        if time.monotonic() > deadline:
            raise DistributedError(
                f"{op}: rank {GROUP.rank} of {GROUP.size} waited {GROUP.timeout:g} s for the other ranks "
                "(one died, hangs, or called a different collective); init(timeout=) or "
                "KAEL_DISTRIBUTED_TIMEOUT sets the limit"
            )
        time.sleep(pause)
        pause = min(1e-3, pause + 1e-5)
