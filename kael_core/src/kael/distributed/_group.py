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
  Before it exits, the hook also ends (SIGTERM) the peers that run on its own machine: MPICH's
  ``mpiexec`` was seen to leave a sleeping rank running after its peer's exit (about 1 run in 6 on
  one CI host), which turns one rank's error into a job that never ends. ``init()`` learns each
  rank's pid, its machine (host name, boot id and pid namespace, so a pid is never read in the
  wrong namespace) and its start time (so a pid reused since is never signalled). Peers on other
  machines are left to ``mpiexec``.
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
import signal
import socket
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

    __slots__ = ("MPI", "comm", "peers", "rank", "size", "timeout")

    def __init__(self) -> None:
        self.MPI: Any = None
        self.comm: Any = None
        self.rank = 0
        self.size = 1
        self.timeout = DEFAULT_TIMEOUT
        self.peers: list[tuple[int, str]] = []  # (pid, start time) of the other ranks on this machine


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
        GROUP.peers = _local_peers()
        _install_excepthook()


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), '' if unknown."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold spaces
    return fields[19] if len(fields) > 19 else ""


def _machine() -> str:
    try:
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}|{_read('/proc/sys/kernel/random/boot_id')}|{namespace}"


def _local_peers() -> list[tuple[int, str]]:
    """Every rank's (machine, pid, start time), gathered once; the other ranks on this machine."""
    from ._collectives import all_gather_bytes

    here = _machine()
    me = f"{here}\n{os.getpid()}\n{_start_time(os.getpid())}"
    peers = []
    for r, data in enumerate(all_gather_bytes(me.encode(), "init")):
        machine, pid, started = data.decode(errors="replace").split("\n")
        if r != GROUP.rank and machine == here and started:
            peers.append((int(pid), started))
    return peers


def _end_local_peers() -> None:
    for pid, started in GROUP.peers:
        if _start_time(pid) == started:  # still the same process
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass


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
            # other ranks as it does for any process that exits before finalizing; the peers on
            # this machine are ended here as well, since mpiexec does not always do it
            _end_local_peers()
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
