"""Fuzz target: the C++ CPU backend's kernels against the NumPy reference backend.

Each input decodes (kernel_spec.decode) to one kernel call: op, dtype, shapes, and per
tensor argument a layout (dim order, gaps between elements, stride-0 broadcasts, storage
offset), with well-behaved values from a seed or, in raw mode, any bit pattern. Every
tensor lives in a buffer larger than its view, filled around it with a sentinel. The
call runs on the reference backend and on the backend under test (`KAEL_FUZZ_BACKEND`,
default "cpu", the C++ backend), on identical buffers. A finding is:

* a result that differs from the reference (within the conformance kit's tolerances;
  raw mode compares only ops that are exact on any bits),
* a write outside the output's elements, or any change to an input's buffer,
* an error on one side only (a `KaelError` from the reference, e.g. integer division
  by zero, must be a `KaelError` from the backend too), an exception that is not a
  `KaelError`, a crash, or a sanitizer report.

Built for fuzzing, the extension is compiled with `-fsanitize=fuzzer-no-link,address,undefined`
(fuzz/build_kernels.sh), so its own edge coverage guides the fuzzer; `fuzz/run.py
fuzz_kernels` builds it and preloads the sanitizer runtime.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import _harness
import numpy as np
from kernel_spec import KernelCase, TensorSpec, decode

with _harness.instrumented(False, []):  # the native extension carries the coverage that matters
    import kael
    from kael import KaelError, Tensor
    from kael.backends import available, host, memory
    from kael.backends import dtypes as dt
    from kael.backends.reference import ReferenceBackend
    from kael.testing import assert_close
    from kael.testing.conformance import KERNEL_TOL, host_bits, vals

CPU = kael.device("cpu")
REFERENCE = ReferenceBackend()
SENTINEL = 0xA5
ACCUMULATING = frozenset(("sum", "prod", "matmul", "softmax", "log_softmax", "layer_norm"))


def _backend_under_test() -> Any:
    name = os.environ.get("KAEL_FUZZ_BACKEND", "cpu")
    found = [b for b in available() if b.name == name]
    if not found:
        raise SystemExit(f"fuzz_kernels: no kael backend named {name!r}; installed: {[b.name for b in available()]}")
    return found[0]


BACKEND = _backend_under_test()


def _storage_dtype(d: dt.DType) -> np.dtype[Any]:
    return np.dtype(np.uint16) if d is dt.bfloat16 else np.dtype(d.np)


def _logical(bits: np.ndarray, d: dt.DType) -> np.ndarray:
    """Values of storage `bits` (bfloat16 widened to float32)."""
    if d is dt.bfloat16:
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits


class Placed:
    """One tensor argument: its buffer on the host (the source of truth) and where the view sits."""

    def __init__(self, spec: TensorSpec, case: KernelCase, rng: np.random.Generator, raw: bytes) -> None:
        self.spec = spec
        self.strides = spec.layout.strides(spec.shape)
        numel = int(np.prod(spec.shape, dtype=np.int64))
        last = spec.layout.offset + sum((s - 1) * st for s, st in zip(spec.shape, self.strides)) if numel else 0
        self.size = max(last, spec.layout.offset) + 3  # room after the view for the sentinel
        sd = _storage_dtype(spec.dtype)
        nbytes = self.size * sd.itemsize
        if spec.role == "in" and case.raw and raw:
            fill = np.frombuffer((raw * (nbytes // len(raw) + 1))[:nbytes], np.uint8).copy()
            if spec.dtype is dt.bool_:
                fill &= 1  # a bool is stored as 0 or 1: other bytes are not bools
        else:
            fill = np.full(nbytes, SENTINEL if spec.dtype is not dt.bool_ else 1, np.uint8)
        self.host = fill.view(sd)
        if spec.role == "index":
            self._place(rng.integers(0, max(spec.bound, 1), size=spec.shape).astype(np.int64))
        elif spec.role == "in" and not case.raw:
            self._place(host_bits(vals(rng, spec.shape, spec.dtype, spec.kind), spec.dtype))
        self.mask = np.zeros(self.size, bool)  # True at the view's elements
        self._view(self.mask)[...] = True

    def _view(self, flat: np.ndarray) -> np.ndarray:
        item = flat.itemsize
        base = flat[self.spec.layout.offset :]
        return np.lib.stride_tricks.as_strided(base, self.spec.shape, tuple(s * item for s in self.strides))

    def _place(self, values: np.ndarray) -> None:
        if values.size:
            self._view(self.host)[...] = values

    def values(self, buffer: np.ndarray) -> np.ndarray:
        return _logical(np.array(self._view(buffer)), self.spec.dtype)

    def tensor(self, backend: Any) -> tuple[Tensor, Tensor]:
        """(the whole buffer as a 1-D tensor, the view) on `backend`, holding a copy of the host buffer."""
        d = self.spec.dtype
        nbytes = self.host.nbytes
        if backend is REFERENCE:
            data = self.host.view(np.uint8).copy()
        else:
            data = backend.allocate(nbytes, CPU)
        flat = memory.wrap_buffer(data, nbytes, CPU, (self.size,), (1,), d)
        if backend is not REFERENCE:
            backend.from_host(flat, self.host)
        view = memory.wrap_buffer(data, nbytes, CPU, self.spec.shape, self.strides, d, self.spec.layout.offset)
        return flat, view


def _specs(args: list[Any]) -> list[TensorSpec]:
    out: list[TensorSpec] = []
    for a in args:
        if isinstance(a, TensorSpec):
            out.append(a)
        elif isinstance(a, list):
            out += a
    return out


def _materialize(case: KernelCase, placed: dict[int, Placed], backend: Any) -> tuple[list[Any], dict[int, Tensor]]:
    """The kernel's arguments on `backend`, and each tensor argument's whole buffer (by spec id)."""
    flats: dict[int, Tensor] = {}
    views: dict[int, Tensor] = {}
    for key, p in placed.items():
        flats[key], views[key] = p.tensor(backend)
    args: list[Any] = []
    if case.alias:  # out is the first input: one tensor, passed twice
        views[id(case.args[0])] = views[id(case.args[1])]
        flats[id(case.args[0])] = flats[id(case.args[1])]
    for a in case.args:
        if isinstance(a, TensorSpec):
            args.append(views[id(a)])
        elif isinstance(a, list):
            args.append([views[id(t)] for t in a])
        else:
            args.append(a)
    return args, flats


def _run(backend: Any, case: KernelCase, args: list[Any]) -> Exception | None:
    try:
        backend.kernel(case.op)(*args)
    except Exception as e:
        return e
    return None


def _host(backend: Any, flat: Tensor) -> np.ndarray:
    if backend is REFERENCE:
        return np.array(host.view(flat))
    return np.asarray(backend.to_host(flat)).reshape(-1)


def _tolerance(case: KernelCase, placed: dict[int, Placed]) -> tuple[float, float]:
    """The loosest tolerance among the call's dtypes (float16 inputs with float32 statistics
    round like float16), grown with the number of terms for ops that accumulate."""
    tols = [KERNEL_TOL.get(p.spec.dtype.name, (0.0, 0.0)) for p in placed.values()]
    rtol, atol = max(t[0] for t in tols), max(t[1] for t in tols)
    if case.op in ACCUMULATING:  # summation order differs: error grows with the number of terms
        terms = max(int(np.prod(p.spec.shape, dtype=np.int64)) for p in placed.values()) or 1
        rtol, atol = rtol * max(1.0, np.sqrt(terms)), atol * max(1.0, np.sqrt(terms))
    return rtol, atol


def _layer_norm_scale(case: KernelCase, placed: dict[int, Placed], ref_flats: dict[int, Tensor]) -> float:
    """How much rounding in the mean is amplified in layer_norm's output: max |x| * max rstd.

    Rows of (nearly) equal values have a tiny variance, so rstd is ~1/sqrt(eps), and a mean
    that rounds differently (summation order) moves every output by ulp(x) * rstd.
    """
    x, rstd = placed[id(case.args[3])], placed[id(case.args[2])]
    xs = np.abs(x.values(x.host).astype(np.float64))
    rs = np.abs(rstd.values(_host(REFERENCE, ref_flats[id(case.args[2])])).astype(np.float64))
    finite = rs[np.isfinite(rs)]
    return float(xs.max(initial=0.0) * finite.max(initial=0.0))


def check(case: KernelCase) -> None:
    if case.op not in BACKEND.supported_ops():
        return  # an optional (fused) op this backend leaves to the frontend's decomposition
    rng = np.random.default_rng(case.seed)
    specs = _specs(case.args)
    placed = {id(s): Placed(s, case, rng, case.values) for s in specs}
    if case.alias:
        del placed[id(case.args[0])]
    ref_args, ref_flats = _materialize(case, placed, REFERENCE)
    with warnings.catch_warnings():  # NumPy's overflow / empty-slice warnings: the values are compared
        warnings.simplefilter("ignore", RuntimeWarning)
        ref_error = _run(REFERENCE, case, ref_args)
    args, flats = _materialize(case, placed, BACKEND)
    error = _run(BACKEND, case, args)
    BACKEND.synchronize(CPU)
    where = case.describe()
    if ref_error is not None and not isinstance(ref_error, KaelError):
        return  # outside the reference's domain: only crashes and sanitizer reports count
    if error is not None and not isinstance(error, KaelError):
        raise AssertionError(f"{where}: backend raised {type(error).__name__} (not a KaelError): {error}") from error
    if (ref_error is None) != (error is None):
        raise AssertionError(
            f"{where}: reference {'raised ' + repr(ref_error) if ref_error else 'succeeded'}, "
            f"backend {'raised ' + repr(error) if error else 'succeeded'}"
        )
    for spec in specs:
        key = id(spec)
        got = _host(BACKEND, flats[key])
        p = placed.get(key) or placed[id(case.args[1])]
        if spec.role == "out" or (case.alias and spec is case.args[1]):
            outside = ~p.mask
            if not np.array_equal(
                got.view(np.uint8).reshape(-1, got.itemsize)[outside],
                p.host.view(np.uint8).reshape(-1, got.itemsize)[outside],
            ):
                raise AssertionError(f"{where}: the kernel wrote outside its output {spec.describe()}")
            if error is None and (not case.raw or case.exact):
                want = p.values(_host(REFERENCE, ref_flats[key]))
                rtol, atol = _tolerance(case, placed) if not case.raw else (0.0, 0.0)
                if case.op == "layer_norm" and spec is case.args[0] and want.size:
                    atol += rtol * _layer_norm_scale(case, placed, ref_flats)
                assert_close(p.values(got), want, rtol=rtol, atol=atol, msg=f"{where}: output {spec.describe()}")
        elif not np.array_equal(got.view(np.uint8), p.host.view(np.uint8)):
            raise AssertionError(f"{where}: the kernel changed its input {spec.describe()}")


def TestOneInput(data: bytes) -> None:
    check(decode(data))


if __name__ == "__main__":
    _harness.fuzz(TestOneInput)
