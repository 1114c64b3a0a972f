"""The op profiler: every dispatched kernel call, timed, with shapes and bytes allocated.

It installs a kernel wrapper in kael's dispatcher for the duration of a
``profile()`` block; outside one, the dispatcher's cache holds the bare kernels
and nothing is measured.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kael import Tensor
from kael.backends import catalogue, dispatch

__all__ = ["OpEvent", "Profile", "profile"]

_active: list[Profile] = []
_lock = threading.Lock()


@dataclass
class OpEvent:
    """One dispatched op: its name, device, backend, operand shapes, start and duration (us), bytes written, thread."""

    name: str
    device: str
    backend: str
    shapes: list[list[int]]
    start_us: float
    dur_us: float
    bytes: int
    thread: int = field(default=0)


def _wrap(device_type: str, op: str, backend: Any, kernel: Callable[..., Any]) -> Callable[..., Any]:
    d = catalogue.CATALOGUE.get(op)
    allocated = d.allocated if d is not None else (0,)  # the outputs the frontend allocated for the call
    bname = getattr(backend, "name", "?")

    def profiled(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return kernel(*args, **kwargs)
        finally:
            dur = time.perf_counter() - t0
            shapes = [list(a.shape) for a in args if isinstance(a, Tensor)]
            nbytes = sum(args[i].nbytes for i in allocated if i < len(args) and isinstance(args[i], Tensor))
            ev = OpEvent(op, device_type, bname, shapes, t0 * 1e6, dur * 1e6, nbytes, threading.get_ident())
            for p in list(_active):
                p.events.append(ev)

    return profiled


class Profile:
    """Collected op events; a context manager (``with kael_debug.profile() as prof``)."""

    def __init__(self) -> None:
        self.events: list[OpEvent] = []

    def __enter__(self) -> Profile:
        with _lock:
            _active.append(self)
            if len(_active) == 1:
                dispatch.set_kernel_wrapper(_wrap)
        return self

    def __exit__(self, *exc: Any) -> None:
        with _lock:
            _active.remove(self)
            if not _active:
                dispatch.set_kernel_wrapper(None)

    def summary(self) -> list[dict[str, Any]]:
        """One row per (op, backend): calls, total microseconds and bytes written."""
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for e in self.events:
            r = rows.setdefault(
                (e.name, e.backend), {"name": e.name, "backend": e.backend, "calls": 0, "total_us": 0.0, "bytes": 0}
            )
            r["calls"] += 1
            r["total_us"] += e.dur_us
            r["bytes"] += e.bytes
        return list(rows.values())

    def table(self, sort_by: str = "total", row_limit: int = 50) -> str:
        """A text summary like PyTorch's profiler: one row per (op, backend)."""
        keys = {"total": "total_us", "calls": "calls", "name": "name", "bytes": "bytes"}
        if sort_by not in keys:
            from kael import KaelError

            raise KaelError(f"table: sort_by must be one of {sorted(keys)}, got {sort_by!r}")
        rows = sorted(self.summary(), key=lambda r: r[keys[sort_by]], reverse=sort_by != "name")[:row_limit]
        total = sum(r["total_us"] for r in rows) or 1.0
        head = f"{'Name':<22}{'Backend':<12}{'Calls':>8}{'Total ms':>12}{'Avg us':>10}{'%':>8}{'Bytes':>14}"
        out = [head, "-" * len(head)]
        for r in rows:
            out.append(
                f"{r['name']:<22}{r['backend']:<12}{r['calls']:>8}{r['total_us'] / 1e3:>12.3f}"
                f"{r['total_us'] / r['calls']:>10.1f}{100 * r['total_us'] / total:>7.1f}%{r['bytes']:>14}"
            )
        out.append(f"Self total: {total / 1e3:.3f} ms over {len(self.events)} ops")
        return "\n".join(out)

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write a Trace Event Format JSON file (opens in Perfetto and chrome://tracing)."""
        pid = os.getpid()
        events = [
            {
                "name": e.name,
                "cat": f"kael.{e.device}",
                "ph": "X",
                "ts": e.start_us,
                "dur": e.dur_us,
                "pid": pid,
                "tid": e.thread,
                "args": {"backend": e.backend, "shapes": e.shapes, "bytes": e.bytes},
            }
            for e in self.events
        ]
        p = os.fspath(path)
        tmp = f"{p}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
        os.replace(tmp, p)


def profile() -> Profile:
    """A profiler: ``with profile() as p:`` records every dispatched op until the block ends."""
    return Profile()
