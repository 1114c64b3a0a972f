"""quantized_linear of the CPU backend per weight format against float32 ``linear``, in one run;
prints JSON.

GPT-2-small-shaped products, x [M, K] @ W [N, K].T: the attention's c_attn (K 768, N 2304),
the MLP's c_fc (768 -> 3072) and c_proj (3072 -> 768), and the LM head (768 -> 50257), with
M = 1 (decode), 8 (batched decode) and 512 (prefill). For each: microseconds per call (the
median over repeats), weight bytes read per call over the time (GB/s: what bounds decode)
and 2*M*N*K over the time (GFLOP/s: what bounds prefill), and float32 linear's time over the
format's (``speedup_vs_f32``). Weights are random values quantized by ``kael.quant``.

Run: python kael_backend_cpu/benchmarks/quant_kernels.py [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import kael
import numpy as np
from kael.quant import quantize_array, to_device_weight

import kael_backend_cpu

__all__ = ["main"]

SHAPES = {"c_attn": (768, 2304), "c_fc": (768, 3072), "c_proj": (3072, 768), "lm_head": (768, 50257)}
SCHEMES = ("q8_0", "q4_0", "bf16", "f16")


def _time(fn: Callable[[], Any], min_s: float = 0.2, repeats: int = 5) -> float:
    """Median seconds per call: `repeats` runs of enough calls to last about `min_s` each."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    number = max(1, int(min_s / one))
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t0) / number)
    return statistics.median(runs)


def _row(name: str, scheme: str, m: int, k: int, n: int, seconds: float, weight_bytes: int) -> dict[str, Any]:
    return {
        "shape": name,
        "scheme": scheme,
        "m": m,
        "k": k,
        "n": n,
        "us": round(seconds * 1e6, 2),
        "weight_bytes": weight_bytes,
        "GB_s": round(weight_bytes / seconds / 1e9, 2),
        "GFLOP_s": round(2.0 * m * n * k / seconds / 1e9, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="c_attn and c_proj only, shorter timing runs")
    p.add_argument("--threads", type=int, default=None, help="threads of the CPU pool (default: as configured)")
    args = p.parse_args()
    if args.threads is not None:
        kael_backend_cpu.set_num_threads(args.threads)
    be = kael_backend_cpu.CpuBackend()
    qlinear, linear = be.kernel("quantized_linear"), be.kernel("linear")
    rng = np.random.default_rng(0)
    shapes = {k: SHAPES[k] for k in ("c_attn", "c_proj")} if args.quick else SHAPES
    min_s = 0.05 if args.quick else 0.2
    results: list[dict[str, Any]] = []
    for name, (k, n) in shapes.items():
        w32 = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        weights = {"f32": kael.tensor(w32)}
        for scheme in SCHEMES:
            weights[scheme] = to_device_weight(quantize_array(w32, scheme), scheme, "cpu")
        bias = kael.tensor(rng.standard_normal(n).astype(np.float32))
        for m in (1, 8, 512):
            x = kael.tensor(rng.standard_normal((m, k)).astype(np.float32))
            out = kael.empty((m, n))
            t32 = _time(functools.partial(linear, out, x, weights["f32"], bias), min_s)
            results.append(_row(name, "f32", m, k, n, t32, 4 * n * k))
            for scheme in SCHEMES:
                w = weights[scheme]
                t = _time(functools.partial(qlinear, out, x, w, bias, scheme), min_s)
                row = _row(name, scheme, m, k, n, t, w.numel() * w.dtype.itemsize)
                row["speedup_vs_f32"] = round(t32 / t, 2)
                results.append(row)
    print(
        json.dumps(
            {"isa": kael_backend_cpu.isa(), "threads": kael_backend_cpu.get_num_threads(), "results": results},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
