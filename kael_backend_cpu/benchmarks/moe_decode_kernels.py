"""Decode-shaped calls of the CPU backend's mixture-of-experts kernels (csrc/moe.cpp) against their
frontend decompositions (the same backend's primitives), in one run; prints JSON (microseconds per
call, medians over repeats).

Shapes: moe_route over [T, 64] router logits, top 8, renormalised; expert_linear of x [T, 512] through
the top 8 of 64 experts of [1536, 512] (a gate and up projection of 768 each), float32, T = 1, 2, 4.
Also `linear` over as many weight bytes as the experts hit (the memory-bound floor the kernel is held
to) and the weight bytes read per second. Run: python kael_backend_cpu/benchmarks/moe_decode_kernels.py
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import kael
import numpy as np
from kael.backends import catalogue
from llama_decode_kernels import _time  # (its sibling: run as a script, this folder is on the path)

import kael_backend_cpu

__all__ = ["main"]

E, K, C, N = 64, 8, 512, 2 * 768


def _decode_step(k: Callable[[str], Any], rng: np.random.Generator, weight: Any, t: int) -> dict[str, Any]:
    """The routing and the expert product of t tokens, kernels against decompositions."""
    route, linear = catalogue.decomposition("moe_route"), catalogue.decomposition("expert_linear")
    logits = kael.tensor(rng.standard_normal((t, E)).astype(np.float32))
    w, ex = kael.empty((t, K)), kael.empty((t, K), dtype=kael.int64)
    k("moe_route")(w, ex, logits, K, True)
    x = kael.expand(kael.unsqueeze(kael.tensor(rng.standard_normal((t, C)).astype(np.float32)), 1), (t, K, C))
    out = kael.empty((t, K, N))
    hit = len(set(ex.numpy().reshape(-1).tolist()))
    flat = kael.tensor(rng.standard_normal((hit * N, C)).astype(np.float32))
    lo = kael.empty((t, hit * N))
    kernel_us = _time(lambda: k("expert_linear")(out, x, weight, ex), number=20)
    return {
        "moe_route [T,64] top 8": {
            "kernel_us": _time(lambda: k("moe_route")(w, ex, logits, K, True)),
            "decomposition_us": _time(lambda: route(logits, K, True)),
        },
        f"expert_linear [T,512] x 8 of 64 [1536,512] ({hit} experts hit)": {
            "kernel_us": kernel_us,
            "decomposition_us": _time(lambda: linear(x, weight, ex), number=20),
            "linear_same_bytes_us": _time(lambda: k("linear")(lo, x[:, 0], flat, None), number=20),
            "kernel_weight_gb_per_s": hit * N * C * 4 / kernel_us / 1e3,
        },
    }


def main() -> None:
    rng = np.random.default_rng(0)
    be = kael_backend_cpu.CpuBackend()
    res: dict[str, Any] = {"isa": kael_backend_cpu.isa(), "threads": kael_backend_cpu.get_num_threads()}
    weight = kael.tensor(rng.standard_normal((E, N, C)).astype(np.float32))
    for t in (1, 2, 4):
        res[f"T={t}"] = _decode_step(be.kernel, rng, weight, t)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
