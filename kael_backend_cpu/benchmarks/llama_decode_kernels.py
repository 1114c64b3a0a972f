"""Decode-shaped calls of the CPU backend's Llama-family kernels against their frontend
decompositions (the same backend's primitives), in one run; prints JSON (microseconds
per call, medians over repeats).

Shapes: rms_norm [1, 576], rope [1, 9, 1, 64], silu_mul on the halves of [1, 2*1536],
grouped-query attention H=9, Hkv=3, D=64 over 512 cached keys (also against the same
kernel on K/V repeated in memory). Run: python kael_backend_cpu/benchmarks/llama_decode_kernels.py
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import kael
import numpy as np
from kael.backends import catalogue

import kael_backend_cpu

__all__ = ["main"]


def _time(fn: Callable[[], Any], repeats: int = 7, number: int = 200) -> float:
    fn()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t0) / number)
    return statistics.median(runs) * 1e6


def _t(a: np.ndarray, dtype: Any = kael.float32) -> Any:
    return kael.tensor(a).to(dtype)


def main() -> None:
    rng = np.random.default_rng(0)
    be = kael_backend_cpu.CpuBackend()
    k = be.kernel
    res: dict[str, Any] = {"isa": kael_backend_cpu.isa(), "threads": kael_backend_cpu.get_num_threads()}

    x, w = _t(rng.standard_normal((1, 576))), _t(rng.standard_normal(576))
    out, rstd = kael.empty((1, 576)), kael.empty((1,))
    dec = catalogue.decomposition("rms_norm")
    res["rms_norm [1,576]"] = {
        "kernel_us": _time(lambda: k("rms_norm")(out, rstd, x, w, 1e-5)),
        "decomposition_us": _time(lambda: dec(x, w, 1e-5)),
    }

    xr = _t(rng.standard_normal((1, 9, 1, 64)))
    ang = np.arange(2048)[:, None] / 10000.0 ** (np.arange(32) / 32)
    cos, sin = _t(np.cos(ang)), _t(np.sin(ang))
    pos = kael.tensor(np.array([[700]], np.int64))
    ro = kael.empty((1, 9, 1, 64))
    dec = catalogue.decomposition("rope")
    res["rope [1,9,1,64]"] = {
        "kernel_us": _time(lambda: k("rope")(ro, xr, cos, sin, pos)),
        "decomposition_us": _time(lambda: dec(xr, cos, sin, pos)),
    }

    both = _t(rng.standard_normal((1, 2 * 1536)))
    gate, up = both[:, :1536], both[:, 1536:]
    so = kael.empty((1, 1536))
    dec = catalogue.decomposition("silu_mul")
    res["silu_mul [1,1536] (halves of [1,3072])"] = {
        "kernel_us": _time(lambda: k("silu_mul")(so, gate, up)),
        "decomposition_us": _time(lambda: dec(gate, up)),
    }

    q = _t(rng.standard_normal((1, 9, 1, 64)))
    kk, vv = _t(rng.standard_normal((1, 3, 512, 64))), _t(rng.standard_normal((1, 3, 512, 64)))
    kr, vr = _t(np.repeat(kk.numpy(), 3, axis=1)), _t(np.repeat(vv.numpy(), 3, axis=1))
    ao = kael.empty((1, 9, 1, 64))
    dec = catalogue.decomposition("attention")
    res["attention H=9 Hkv=3 D=64 Tk=512 Tq=1"] = {
        "kernel_us": _time(lambda: k("attention")(ao, q, kk, vv, 0.125, True, None)),
        "kernel_on_repeated_kv_us": _time(lambda: k("attention")(ao, q, kr, vr, 0.125, True, None)),
        "decomposition_us": _time(lambda: dec(q, kk, vv, 0.125, True, None), number=50),
    }
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
