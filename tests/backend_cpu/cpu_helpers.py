"""Helpers for the native CPU backend tests: layouts, values, tolerances, allocation, the GIL.

Operands are built over NumPy memory in a chosen layout (contiguous, transposed,
strided with a step, offset, broadcast with stride 0) so the same input tensors can
be handed to the backend under test and to the reference kernels; outputs of the
backend under test come from its own allocator.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from kael import _dtype as dt
from kael._device import CPU
from kael._storage import Storage
from kael._tensor import Tensor, contiguous_strides, from_numpy_bits
from kael.backends.host import f32_to_bf16_bits
from kael.testing import assert_close

LAYOUTS = ("contiguous", "transposed", "stepped", "offset", "broadcast")


def bits(values: np.ndarray, d: dt.DType) -> np.ndarray:
    """Storage bits of logical values in dtype d (bfloat16 as uint16)."""
    if d is dt.bfloat16:
        return f32_to_bf16_bits(np.asarray(values, dtype=np.float32)).reshape(np.shape(values))
    with np.errstate(all="ignore"):
        return np.asarray(values).astype(d.np)


def logical(t: Tensor) -> np.ndarray:
    """A host copy of a tensor's values (bfloat16 widened to float32)."""
    return np.array(t._host(), copy=True)


def vals(t: Tensor) -> np.ndarray:
    """A tensor's values as float64."""
    return logical(t).astype(np.float64)


def round_to(v: Any, d: dt.DType) -> np.ndarray:
    """float64 values (an array or a scalar) rounded to dtype d (nearest even), as float64."""
    v = np.asarray(v, dtype=np.float64)
    if d is dt.bfloat16:
        b = f32_to_bf16_bits(v.astype(np.float32)).astype(np.uint32) << 16
        return b.view(np.float32).astype(np.float64)
    if d in (dt.float16, dt.float32):
        return v.astype(d.np).astype(np.float64)
    return v


def place(values: np.ndarray, d: dt.DType, layout: str) -> Tensor:
    """A tensor holding `values` (logical) in the given memory layout, over NumPy memory."""
    b = bits(values, d)
    if b.ndim == 0 or b.size == 0 or layout == "contiguous":
        arr = np.array(b, copy=True, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
    elif layout == "transposed":
        arr = np.ascontiguousarray(b.T).T
    elif layout == "stepped":
        big = np.zeros(tuple(2 * n for n in b.shape), dtype=b.dtype)
        big[tuple(slice(None, None, 2) for _ in b.shape)] = b
        arr = big[tuple(slice(None, None, 2) for _ in b.shape)]
    elif layout == "offset":
        big = np.zeros((b.shape[0] + 1, *b.shape[1:]), dtype=b.dtype)
        big[1:] = b
        arr = big[1:]
    elif layout == "broadcast":
        # values must be constant along the broadcast dims: use the first slice along dim 0
        src = np.array(b[:1], copy=True, order="C")
        arr = np.broadcast_to(src, b.shape)
    else:
        raise ValueError(layout)
    return from_numpy_bits(arr, d)


def cpu_empty(backend: Any, shape: tuple[int, ...], d: dt.DType) -> Tensor:
    n = int(np.prod(shape, dtype=np.int64)) * d.itemsize
    return Tensor._make(Storage(backend.allocate(n, CPU), n, CPU), shape, contiguous_strides(shape), 0, d)


def host_empty(shape: tuple[int, ...], d: dt.DType) -> Tensor:
    return from_numpy_bits(np.zeros(shape, dtype=d.np), d)


def random_values(rng: np.random.Generator, shape: tuple[int, ...], d: dt.DType, kind: str = "normal") -> np.ndarray:
    if d is dt.bool_:
        return rng.random(shape) < 0.5
    if d.is_floating_point:
        v = rng.standard_normal(shape)
        if kind == "positive":
            v = np.abs(v) + 0.1
        elif kind == "nonzero":
            v = np.where(np.abs(v) < 0.5, 0.5 + np.abs(v), v) * np.sign(v + 1e-9)
        return v
    lo = 0 if d is dt.uint8 else -20
    v = rng.integers(lo, 20, size=shape)
    if kind == "nonzero":
        v = np.where(v == 0, 3, v)
    if kind == "positive":
        v = np.abs(v) % 5
    return v


TOL = {"float64": (1e-9, 1e-12), "float32": (2e-6, 1e-6), "float16": (2e-3, 1e-3), "bfloat16": (1.6e-2, 1e-2)}


def tol(d: dt.DType, scale: float = 1.0) -> dict[str, float]:
    rtol, atol = TOL.get(d.name, (0.0, 0.0))
    return {"rtol": rtol * scale, "atol": atol * scale}


def close(actual: Any, expected: Any, d: dt.DType, scale: float, msg: str = "") -> None:
    """assert_close within tol(d, scale)."""
    t = tol(d, scale)
    assert_close(actual, expected, rtol=t["rtol"], atol=t["atol"], msg=msg)


#: hypothesis's draws for ``check_gated``: shapes of up to 3 dims of 0 to 7, each float dtype and layout, gates
#: scaled by 1 or 10, seeds.
GATED_CASES = given(
    shape=st.lists(st.integers(0, 7), min_size=0, max_size=3).map(tuple),
    dtype=st.sampled_from(["float16", "bfloat16", "float32", "float64"]),
    layout=st.sampled_from(LAYOUTS),
    scale=st.sampled_from([1.0, 10.0]),
    seed=st.integers(0, 2**16),
)


def check_gated(cpu: Any, op: str, oracle: Any, shape: tuple, dtype: str, layout: str, scale: float, seed: int) -> None:
    """The backend's gated kernel ``op`` (silu_mul, gelu_tanh_mul: out = act(gate) * up) on a gate drawn
    N(0, scale^2) in ``layout`` and an up in the transposed one equals ``oracle(gate, up, d)`` (float64) within
    tol(d, 2)."""
    rng = np.random.default_rng(seed)
    d = dt.BY_NAME[dtype]
    g = place(rng.standard_normal(shape) * scale, d, layout)
    u = place(rng.standard_normal(shape), d, "transposed")
    out = cpu_empty(cpu, shape, d)
    cpu.kernel(op)(out, g, u)
    close(vals(out), oracle(vals(g), vals(u), d), d, 2.0, msg=f"{op} {dtype} {layout}")


def check_gated_halves(cpu: Any, op: str, oracle: Any, dtype: str, inter: int) -> None:
    """``check_gated`` with gate and up the two halves of one [2, 3, 2 * inter] projection output (strided views,
    as an MLP's fused gate/up product hands them over)."""
    d = dt.BY_NAME[dtype]
    rng = np.random.default_rng(inter)
    both = place(rng.standard_normal((2, 3, 2 * inter)) * 4, d, "contiguous")
    gate, up = both[..., :inter], both[..., inter:]
    assert gate._strides[-2] == 2 * inter
    out = cpu_empty(cpu, (2, 3, inter), d)
    cpu.kernel(op)(out, gate, up)
    bv = vals(both)
    close(vals(out), oracle(bv[..., :inter], bv[..., inter:], d), d, 2.0, msg=f"{dtype}")


def runs_while(call: Any) -> bool:
    """Whether this thread runs Python code while `call` runs in another thread (a kernel that releases the GIL
    lets it; a loaded machine may not schedule it during one call, so callers try a few times)."""
    span: dict[str, float] = {}
    started = threading.Event()

    def work() -> None:
        started.set()
        span["t0"] = time.perf_counter()
        call()
        span["t1"] = time.perf_counter()

    th = threading.Thread(target=work)
    stamps: list[float] = []
    th.start()
    started.wait()
    while th.is_alive():
        stamps.append(time.perf_counter())
    th.join()
    # stamps strictly inside the call: impossible while the call holds the GIL
    return any(span["t0"] < s < span["t1"] for s in stamps)


def other_isas() -> list[str]:
    """The vector tables this machine can run besides the one selected (names as ``KAEL_CPU_ISA`` takes them)."""
    import kael_backend_cpu._native as native

    c = native.C
    info = c.isa_info() if hasattr(c, "isa_info") else {"runnable": [c.isa(), "base"]}
    return [name for name in info["runnable"] if name not in (c.isa(), "baseline" if c.isa() == "base" else "")]


def pytest_child(test_file: str, select: str, timeout: int = 600, **env: str) -> tuple[int, str]:
    """`test_file`'s tests that ``-k select`` picks, in a child pytest with these environment variables set: its
    return code and its output's tail (the last 4,000 characters of stdout, 2,000 of stderr)."""
    import os
    import subprocess
    import sys

    args = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test_file, "-k", select]
    res = subprocess.run(
        args,
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=os.path.dirname(test_file),
    )
    return res.returncode, res.stdout[-4000:] + res.stderr[-2000:]


def rerun_under_isa(test_file: str, isa: str) -> None:
    """Run `test_file`'s tests again in a child pytest with ``KAEL_CPU_ISA=isa`` (``KAEL_QUANT_TEST_ISA``
    tells the child which table it must be on); fails with the child's output tail."""
    rc, out = pytest_child(test_file, "not every_vector_table", 1800, KAEL_CPU_ISA=isa, KAEL_QUANT_TEST_ISA=isa)
    assert rc == 0, out
