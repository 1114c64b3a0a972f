"""The weight-format section of ``validate.py``: every scheme's CUDA kernels on the GPU.

For each scheme the cuda backend declares (``_quant.QUANT_SCHEMES``): the ``dequantize``
kernel on random bytes against ``gguf.quants.dequantize`` (kael's registry reference when the
``gguf`` package is absent), bit for bit; ``quantized_linear`` against float64 NumPy on its
few-row path (1 and 16 rows) and its dequantize + cuBLAS path (64 rows); rows of the few-row
path bit-identical batched and alone; and the time of one call at 1 and 64 rows on a
4096 x 4096 weight (after a warm-up, with ``kael.cuda.synchronize``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

__all__ = ["quant_formats"]


def _reference(raw: np.ndarray, scheme: str, k: int) -> np.ndarray:
    """float32 [n, k] values of the uint8 rows raw: gguf's dequantizer, else kael's registry reference."""
    with np.errstate(invalid="ignore", over="ignore"):
        try:
            import gguf

            got = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[scheme.upper()])
            return np.asarray(got, np.float32).reshape(raw.shape[0], k)
        except ImportError:
            from kael.quant.formats import FORMATS

            return FORMATS[scheme].dequantize(raw, k)


def _random_rows(rng: np.random.Generator, scheme: str, n: int, k: int) -> np.ndarray:
    """uint8 [n, row bytes] of random blocks whose float16 scales are small and finite."""
    from kael.quant.formats import FORMATS

    from kael_backend_cuda import _quant

    raw = rng.integers(0, 256, (n, FORMATS[scheme].row_bytes(k)), np.uint8)
    if scheme in _quant.BLOCK_BYTES:  # every half-aligned scale candidate: first/last 4 bytes of a block
        b = raw.reshape(-1, _quant.BLOCK_BYTES[scheme])
        for at in {0, 2, b.shape[1] - 4, b.shape[1] - 2}:
            b[:, at : at + 2] = rng.choice([0.01, -0.004, 0.002], len(b)).astype("<f2").view(np.uint8).reshape(-1, 2)
    return raw


def _weight(raw: np.ndarray, scheme: str, k: int) -> Any:
    import kael

    if scheme == "f16":
        return kael.tensor(raw.view("<f2"), dtype=kael.float16, device="cuda")
    if scheme == "bf16":  # its values (exactly bfloat16) as float32; kael keeps their top 16 bits
        bits = raw.view("<u2").astype(np.uint32) << np.uint32(16)
        return kael.tensor(np.nan_to_num(bits.view(np.float32)), dtype=kael.bfloat16, device="cuda")
    return kael.tensor(raw, dtype=kael.uint8, device="cuda")


def _one(scheme: str, quick: bool) -> dict[str, Any]:
    import kael

    backend = kael.backends.current("cuda")
    rng = np.random.default_rng(0)
    n, k = 96, 1024
    if scheme in ("bf16", "f16"):  # finite values, exactly representable in the scheme
        a = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        bits = (a.view(np.uint32) >> 16).astype("<u2") if scheme == "bf16" else a.astype("<f2").view("<u2")
        raw = bits.view(np.uint8).reshape(n, -1)
        wf = (
            (bits.astype(np.uint32) << 16).view(np.float32) if scheme == "bf16" else bits.view("<f2").astype(np.float32)
        )
    else:
        raw = _random_rows(rng, scheme, n, k)
        wf = _reference(raw, scheme, k)
    w = _weight(raw, scheme, k)
    out = kael.empty(n, k, dtype=kael.float32, device="cuda")
    backend.kernel("dequantize")(out, w, scheme)
    res: dict[str, Any] = {"dequantize_exact": bool(np.array_equal(out.cpu().numpy(), wf, equal_nan=True))}
    x = rng.standard_normal((64, k)).astype(np.float32)
    ql = backend.kernel("quantized_linear")
    worst = 0.0
    got: dict[int, np.ndarray] = {}
    for rows in (1, 16, 64):
        y = kael.empty(rows, n, dtype=kael.float32, device="cuda")
        ql(y, kael.tensor(x[:rows], device="cuda"), w, None, scheme)
        got[rows] = y.cpu().numpy()
        want = x[:rows].astype(np.float64) @ wf.astype(np.float64).T
        scale = np.abs(x[:rows]).astype(np.float64) @ np.abs(wf).astype(np.float64).T + 1e-30
        worst = max(worst, float(np.max(np.abs(got[rows] - want) / scale)))
    res["qlinear_worst_error_over_abs_sum"] = worst
    res["few_rows_batched_equal_alone"] = bool(np.array_equal(got[16][0], got[1][0]))
    res["ok"] = res["dequantize_exact"] and res["few_rows_batched_equal_alone"] and worst < 1e-5
    if not quick:
        big = _weight(_random_rows(rng, scheme, 4096, 4096), scheme, 4096)
        for rows in (1, 64):
            xb = kael.tensor(rng.standard_normal((rows, 4096)).astype(np.float32), device="cuda")
            y = kael.empty(rows, 4096, dtype=kael.float32, device="cuda")
            ql(y, xb, big, None, scheme)
            kael.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(10):
                ql(y, xb, big, None, scheme)
            kael.cuda.synchronize()
            res[f"us_4096x4096_rows_{rows}"] = round((time.perf_counter() - t0) / 10 * 1e6, 1)
    return res


def quant_formats(quick: bool) -> dict[str, Any]:
    """One row per scheme the cuda backend declares; ok when every one is."""
    from kael_backend_cuda import _quant

    rows = {s: _one(s, quick) for s in _quant.QUANT_SCHEMES}
    return {"ok": all(r["ok"] for r in rows.values()), "schemes": rows}
