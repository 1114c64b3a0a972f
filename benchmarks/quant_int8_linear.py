"""quantized_linear on the CPU backend: the float32-activation path against the integer path
(KAEL_QUANT_ACTIVATIONS=f32 / q8, NOTE [integer quantized linear] in kael_backend_cpu/csrc/quant.cpp).

Weights in any block format of kael's registry (--schemes; Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 by default; the
super-block formats' integer path takes Q8_K activations), quantized by kael.quant.quantize_array (byte-exact with
ggml's reference quantizers), of GPT-2 small's shapes (c_fc: 768 -> 3072; lm_head: 768 -> 50257), 1 and 8
activation rows (--rows: more than 16 is a prompt's, where q8 runs waves of 16 rows), 1 and 2 threads, both paths timed in the same process with their rounds
interleaved (best of --repeats calls in each of --rounds rounds). Prints JSON: milliseconds per
call, weight GB/s (weight bytes / time) and the integer path's speed-up; --out writes it too.

    python benchmarks/quant_int8_linear.py [--threads 1 2] [--rows 1 8] [--schemes ...] [--shapes ...]
        [--repeats 20] [--rounds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from kael.quant import BLOCK_VALUES, quantize_array

__all__ = ["main"]

SHAPES = {"c_fc": (768, 3072), "lm_head": (768, 50257)}
#: every block format of kael's registry (each has an integer path); the default times the 32-value ones llama.cpp
#: pairs with Q8_0 / Q8_1 activations
SCHEMES = tuple(BLOCK_VALUES)
DEFAULT_SCHEMES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")


def _best_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def _backend() -> dict[str, Any]:
    """The modules and the CPU backend's quantized_linear kernel."""
    from kael import _dtype as dt
    from kael._tensor import from_numpy_bits
    from kael_backend_cpu._native import C

    import kael_backend_cpu as kbc

    kernel = kbc.CpuBackend().kernel("quantized_linear")
    return {"kbc": kbc, "dt": dt, "wrap": from_numpy_bits, "kernel": kernel, "isa": C.isa()}


def _weights(rng: np.random.Generator, scheme: str, n: int, k: int) -> np.ndarray:
    """n x k standard normal weights as `scheme`'s blocks (uint8 rows; kael's quantizer, byte-exact with ggml's)."""
    return np.asarray(quantize_array(rng.standard_normal((n, k)).astype(np.float32), scheme))


def run(
    threads: list[int],
    repeats: int,
    rounds: int,
    rows_list: tuple[int, ...] = (1, 8),
    schemes: tuple[str, ...] = DEFAULT_SCHEMES,
    shapes: tuple[str, ...] = tuple(SHAPES),
) -> dict[str, Any]:
    """Times every case; returns the JSON document."""
    env = _backend()
    kbc, dt, wrap, kernel = env["kbc"], env["dt"], env["wrap"], env["kernel"]
    rng = np.random.default_rng(0)
    results: list[dict[str, Any]] = []
    before = kbc.get_num_threads()
    try:
        for scheme in schemes:
            for shape_name in shapes:
                k, n = SHAPES[shape_name]
                w = _weights(rng, scheme, n, k)
                wt = wrap(w, dt.uint8)
                for rows in rows_list:
                    xt = wrap(rng.standard_normal((rows, k)).astype(np.float32), dt.float32)
                    out = wrap(np.zeros((rows, n), np.float32), dt.float32)
                    for t in threads:
                        kbc.set_num_threads(t)
                        best = {"f32": float("inf"), "q8": float("inf")}
                        for _ in range(rounds):
                            for path in best:
                                os.environ["KAEL_QUANT_ACTIVATIONS"] = path
                                ms = _best_ms(lambda: kernel(out, xt, wt, None, scheme), repeats)
                                best[path] = min(best[path], ms)
                        results.append(
                            {
                                "scheme": scheme,
                                "shape": shape_name,
                                "k": k,
                                "n": n,
                                "rows": rows,
                                "threads": t,
                                "f32_ms": round(best["f32"], 4),
                                "q8_ms": round(best["q8"], 4),
                                "f32_weight_gbs": round(w.nbytes / best["f32"] / 1e6, 2),
                                "q8_weight_gbs": round(w.nbytes / best["q8"] / 1e6, 2),
                                "speedup_q8": round(best["f32"] / best["q8"], 3),
                            }
                        )
                        print(json.dumps(results[-1]), flush=True)
    finally:
        kbc.set_num_threads(before)
        os.environ.pop("KAEL_QUANT_ACTIVATIONS", None)
    return {
        "machine": platform.processor() or platform.machine(),
        "isa": env["isa"],
        "cpus": os.cpu_count(),
        "results": results,
    }


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--schemes", nargs="+", choices=list(SCHEMES), default=list(DEFAULT_SCHEMES))
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    doc = run(args.threads, args.repeats, args.rounds, tuple(args.rows), tuple(args.schemes), tuple(args.shapes))
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
