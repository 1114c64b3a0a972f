"""Running one table row on the backend under test and on the reference, and comparing.

The reference side never goes through the dispatcher: its operands wrap NumPy memory
and it calls ``ReferenceBackend`` kernels directly, so it stays a fixed oracle even
when the backend under test serves ``cpu`` too. The device side allocates through
the backend (``allocate``/``from_host``), builds the same layouts with frontend views
(which never touch a backend), calls the backend's kernel, and reads back with
``to_host``. Besides the values, a run checks that the kernel wrote nothing outside
its outputs (sentinels around strided outputs; inputs unchanged).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import kael
from kael import Backend, Tensor
from kael.backends import dtypes as dt
from kael.backends.reference import ReferenceBackend
from kael.testing import assert_close

from ._cases import KERNEL_TOL, Call, Case
from ._layout import SENTINEL, Alias, Operand, Out, _strided_buffer, host_bits, host_tensor, place

__all__ = [
    "REFERENCE",
    "Run",
    "run_reference",
    "run_on",
    "check_kernel",
    "check_decomposition",
    "device_factory",
    "host_values",
]

REFERENCE = ReferenceBackend()

#: (rtol, atol) for a decomposition (many primitive roundings) against the fused reference kernel.
DECOMP_TOL: dict[str, tuple[float, float]] = {
    "float64": (1e-9, 1e-10),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-2),
    "bfloat16": (6e-2, 6e-2),
}

Make = Callable[[np.ndarray, dt.DType], Tensor]
Empty = Callable[[tuple[int, ...], dt.DType], Tensor]


@dataclass
class Run:
    """A materialised call: the kernel's arguments, its outputs, and what to check afterwards."""

    args: list[Any]
    outputs: list[Tensor]
    guards: list[tuple[Tensor, np.ndarray, Any]]  # (buffer, mask of untouched positions, sentinel value)
    inputs: list[tuple[int, Tensor, np.ndarray]]  # (argument position, tensor, values before the call)


def host_values(t: Tensor) -> np.ndarray:
    """A host copy of t's values (bfloat16 widened to float32)."""
    return np.array(np.asarray(t), copy=True)


def _sentinel(d: dt.DType) -> Any:
    return np.asarray(host_bits(np.asarray(SENTINEL), d))


def _logical_np(d: dt.DType) -> Any:
    return np.float32 if d is dt.bfloat16 else d.np


def materialize(call: Call, make: Make, empty: Empty) -> Run:
    args: list[Any] = []
    outputs: list[Tensor] = []
    guards: list[tuple[Tensor, np.ndarray, Any]] = []
    inputs: list[tuple[int, Tensor, np.ndarray]] = []

    def operand(o: Operand) -> Tensor:
        return place(host_bits(o.values, o.dtype), o.dtype, o.layout, lambda h: make(h, o.dtype), o.shape)

    for i, a in enumerate(call.args):
        if isinstance(a, Operand):
            t = operand(a)
            args.append(t)
            inputs.append((i, t, host_values(t)))
        elif isinstance(a, list) and a and all(isinstance(x, Operand) for x in a):
            ts = [operand(x) for x in a]
            args.append(ts)
            inputs.extend((i, t, host_values(t)) for t in ts)
        elif isinstance(a, Out):
            if a.layout == "strided":
                init = np.full(a.shape, SENTINEL) if a.init is None else a.init
                big, select = _strided_buffer(host_bits(init, a.dtype), _sentinel(a.dtype))
                buf = make(big, a.dtype)
                t = select(buf)
                outside = _strided_buffer(np.zeros(a.shape, bool), True)[0]  # True where the view is not
                guards.append((buf, outside, np.asarray(SENTINEL).astype(_logical_np(a.dtype))))
            elif a.init is not None:
                t = make(host_bits(a.init, a.dtype), a.dtype)
            else:
                t = empty(a.shape, a.dtype)
            args.append(t)
        else:
            args.append(a)
    for i, a in enumerate(call.args):
        if isinstance(a, Alias):
            args[i] = args[a.index]
            inputs = [x for x in inputs if x[0] != a.index]
    for i, a in enumerate(call.args):
        if isinstance(a, (Out, Alias)):
            outputs.append(args[i])
    return Run(args, outputs, guards, inputs)


def _host_make(h: np.ndarray, d: dt.DType) -> Tensor:
    return host_tensor(h, d)


def _host_empty(shape: tuple[int, ...], d: dt.DType) -> Tensor:
    return host_tensor(np.zeros(shape, d.np), d)


def device_factory(backend: Backend, device: Any) -> tuple[Make, Empty]:
    """Allocation on the backend under test: allocate + from_host, nothing else."""

    def make(h: np.ndarray, d: dt.DType) -> Tensor:
        t = kael.empty(tuple(h.shape), dtype=d, device=device)
        if h.size:
            backend.from_host(t, np.asarray(h, order="C"))
        return t

    def empty(shape: tuple[int, ...], d: dt.DType) -> Tensor:
        return kael.empty(shape, dtype=d, device=device)

    return make, empty


def run_reference(case: Case, call: Call) -> list[np.ndarray]:
    run = materialize(call, _host_make, _host_empty)
    REFERENCE.kernel(case.op)(*run.args)
    return [host_values(t) for t in run.outputs]


def run_on(case: Case, call: Call, backend: Backend, device: Any) -> tuple[Run, list[np.ndarray]]:
    make, empty = device_factory(backend, device)
    run = materialize(call, make, empty)
    kernel = backend.kernel(case.op)
    try:
        kernel(*run.args)
        backend.synchronize(run.outputs[0].device if run.outputs else device)
    except Exception as exc:
        raise AssertionError(
            f"{case.where()}: backend {backend.name!r} kernel raised {type(exc).__name__}: {exc}"
        ) from exc
    return run, [host_values(t) for t in run.outputs]


def _tolerance(call: Call, out_dtype: str, table: dict[str, tuple[float, float]]) -> tuple[float, float]:
    rtol, atol = table.get(out_dtype, (0.0, 0.0))
    return (call.rtol if call.rtol is not None else rtol), (call.atol if call.atol is not None else atol)


def _out_dtypes(run: Run) -> list[str]:
    return [t.dtype.name for t in run.outputs]


def check_kernel(case: Case, backend: Backend, device: Any) -> None:
    """The backend's kernel for case.op matches the reference kernel on this row, touching only its outputs."""
    call = case.call()
    want = run_reference(case, call)
    run, got = run_on(case, call, backend, device)
    for k, (g, w, dname) in enumerate(zip(got, want, _out_dtypes(run))):
        rtol, atol = _tolerance(call, dname, KERNEL_TOL)
        assert_close(g, w, rtol=rtol, atol=atol, msg=f"{case.where()}, output {k} ({dname})")
    for buf, mask, sentinel in run.guards:
        outside = host_values(buf)[mask]
        if outside.size and not np.all(outside == sentinel):
            n = int(np.count_nonzero(outside != sentinel))
            raise AssertionError(f"{case.where()}: the kernel wrote {n} element(s) outside its strided output view")
    for pos, t, before in run.inputs:
        after = host_values(t)
        if not np.array_equal(after, before, equal_nan=before.dtype.kind == "f"):
            raise AssertionError(
                f"{case.where()}: the kernel modified its input argument {pos} ({t.dtype.name}{list(t.shape)})"
            )


def check_decomposition(case: Case, decomposition: Callable[..., Any], device: Any, backend: Backend) -> None:
    """The frontend decomposition of a fused op, on the backend's primitives, matches the reference kernel."""
    call = case.call()
    want = run_reference(case, call)
    make, empty = device_factory(backend, device)
    run = materialize(call, make, empty)
    out_pos = set(call.outputs())
    inputs = [a for i, a in enumerate(run.args) if i not in out_pos]
    try:
        res = decomposition(*inputs)
    except Exception as exc:
        raise AssertionError(f"{case.where()}: the decomposition raised {type(exc).__name__}: {exc}") from exc
    results = list(res) if isinstance(res, tuple) else [res]
    if len(results) != len(want):
        raise AssertionError(f"{case.where()}: the decomposition returned {len(results)} outputs, expected {len(want)}")
    for k, (r, w, t) in enumerate(zip(results, want, run.outputs)):
        # the decomposition may compute a statistic (layer_norm's mean) in a narrower dtype than the kernel
        tols = [DECOMP_TOL.get(n, (0.0, 0.0)) for n in (t.dtype.name, getattr(r, "dtype", t.dtype).name)]
        rtol, atol = max(x[0] for x in tols), max(x[1] for x in tols)
        assert_close(
            host_values(r),
            w,
            rtol=rtol,
            atol=atol,
            msg=f"{case.where()}: decomposition output {k} vs the reference kernel",
        )
