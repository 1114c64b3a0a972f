"""quantized_linear of the CPU backend per weight format against float32 ``linear``, in one run;
prints JSON.

GPT-2-small-shaped products, x [M, K] @ W [N, K].T: the attention's c_attn (K 768, N 2304),
the MLP's c_fc (768 -> 3072) and c_proj (3072 -> 768), and the LM head (768 -> 50257), with
M = 1 (decode), 8 (batched decode) and 512 (prefill). For each: microseconds per call (the
median over repeats), weight bytes read per call over the time (GB/s: what bounds decode)
and 2*M*N*K over the time (GFLOP/s: what bounds prefill), and float32 linear's time over the
format's (``speedup_vs_f32``). Weights are random values quantized by ``kael.quant``; the
formats it cannot quantize yet (iq4_nl, q2_k .. q6_k, iq4_xs) are random blocks with finite
float16 scales (their speed does not depend on the values).

Run: python kael_backend_cpu/benchmarks/quant_kernels.py [--quick] [--threads N] [--schemes q4_0,q4_k,...]
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
from kael.quant.formats import FORMATS

import kael_backend_cpu

__all__ = ["main"]

SHAPES = {"c_attn": (768, 2304), "c_fc": (768, 3072), "c_proj": (3072, 768), "lm_head": (768, 50257)}
SCHEMES = (
    *("q8_0", "q4_0", "bf16", "f16"),  # kael.quant.quantize_array's
    *("q4_1", "q5_0", "q5_1", "iq4_nl"),  # kael.quant.formats' block quantizers (iq4_nl: random)
    *("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs"),
)
# The formats kael.quant cannot quantize yet: values and bytes a block, where its float16 scales sit.
RANDOM_BLOCKS = {
    "iq4_nl": (32, 18, (0,)),
    "q2_k": (256, 84, (80, 82)),
    "q3_k": (256, 110, (108,)),
    "q4_k": (256, 144, (0, 2)),
    "q5_k": (256, 176, (0, 2)),
    "q6_k": (256, 210, (208,)),
    "iq4_xs": (256, 136, (0,)),
}


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


def _weight(w32: np.ndarray, scheme: str, rng: np.random.Generator) -> Any:
    """w32 in `scheme` as the tensor quantized_linear takes (random blocks for RANDOM_BLOCKS' formats)."""
    if scheme in SCHEMES[:4]:
        return to_device_weight(quantize_array(w32, scheme), scheme, "cpu")
    if scheme not in RANDOM_BLOCKS:
        return kael.tensor(np.ascontiguousarray(FORMATS[scheme].quantize(w32)))
    n, k = w32.shape
    values, nbytes, offsets = RANDOM_BLOCKS[scheme]
    data = rng.integers(0, 256, (n, k // values, nbytes), dtype=np.uint8)
    for off in offsets:
        scale = (rng.uniform(0.5, 1.0, (n, k // values)) / 256).astype(np.float16)
        data[:, :, off : off + 2] = scale.view(np.uint8).reshape(n, k // values, 2)
    return kael.tensor(data.reshape(n, -1))


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
    p.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated formats (default: all)")
    p.add_argument("--rows", default="1,8,512", help="comma-separated M values (default: 1,8,512)")
    args = p.parse_args()
    if args.threads is not None:
        kael_backend_cpu.set_num_threads(args.threads)
    be = kael_backend_cpu.CpuBackend()
    qlinear, linear = be.kernel("quantized_linear"), be.kernel("linear")
    rng = np.random.default_rng(0)
    shapes = {k: SHAPES[k] for k in ("c_attn", "c_proj")} if args.quick else SHAPES
    schemes = tuple(args.schemes.split(","))
    unknown = [s for s in schemes if s not in SCHEMES]
    if unknown:
        p.error(f"unknown schemes {unknown}; expected some of {', '.join(SCHEMES)}")
    min_s = 0.05 if args.quick else 0.2
    results: list[dict[str, Any]] = []
    for name, (k, n) in shapes.items():
        w32 = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        weights = {"f32": kael.tensor(w32)}
        for scheme in schemes:
            weights[scheme] = _weight(w32, scheme, rng)
        bias = kael.tensor(rng.standard_normal(n).astype(np.float32))
        for m in (int(r) for r in args.rows.split(",")):
            x = kael.tensor(rng.standard_normal((m, k)).astype(np.float32))
            out = kael.empty((m, n))
            t32 = _time(functools.partial(linear, out, x, weights["f32"], bias), min_s)
            results.append(_row(name, "f32", m, k, n, t32, 4 * n * k))
            for scheme in schemes:
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
