"""Table rows for the fused ops (optional for a backend; each has a reference kernel).

The same rows serve twice: a backend that implements a fused op is checked against
the reference kernel, and every op with a frontend decomposition
(``kael.backends.catalogue.decomposition``) has that decomposition, run on the backend's
primitives, checked against the reference kernel too. Elementwise fused ops (silu) have
their rows in ``_table_elementwise``, made from the catalogue.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kael.backends import dtypes as dt

from ._cases import FLOATS, Call, Case, operand, vals
from ._layout import Operand, Out
from ._table_batch_norm import BATCH_NORM_BUILDERS
from ._table_conv import CONV_BUILDERS
from ._table_gated import gated_rows
from ._table_gemma import GEMMA_BUILDERS
from ._table_moe import MOE_BUILDERS
from ._table_pool import POOL_BUILDERS

__all__ = ["fused_cases"]

Builder = Callable[[np.random.Generator], Call]
FULL = (dt.float32, dt.float64)
HEADS = "permute:0,2,1,3"  # q/k/v viewed [B, H, T, D] from [B, T, H, D] storage, as GPT-2 splits heads


def _stat(d: dt.DType) -> dt.DType:
    return dt.float64 if d is dt.float64 else dt.float32


def _linear(d: dt.DType) -> dict[str, Builder]:
    kind = "halves" if d.itemsize == 2 else "normal"

    def mk(xs: tuple[int, ...], lx: str, lw: str, bias: bool) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            x = operand(rng, xs, d, lx, kind)
            w = operand(rng, (5, xs[-1]), d, lw, kind)
            b = operand(rng, (5,), d, "contiguous", kind) if bias else None
            return Call([Out(xs[:-1] + (5,), d), x, w, b])

        return build

    s = {"2d": mk((4, 3), "contiguous", "contiguous", True), "no_bias": mk((4, 3), "contiguous", "contiguous", False)}
    if d in FULL:
        s["3d"] = mk((2, 4, 3), "contiguous", "contiguous", True)
        s["x_transposed"] = mk((4, 3), "transposed", "contiguous", True)
        s["w_transposed"] = mk((4, 3), "strided", "transposed", False)
    return s


def _gelu(d: dt.DType) -> dict[str, Builder]:
    def mk(shape: tuple[int, ...], lay: str, approx: str) -> Builder:
        return lambda rng: Call([Out(shape, d), operand(rng, shape, d, lay), approx])

    s: dict[str, Builder] = {}
    for approx in ("tanh", "none"):
        shapes = {
            "1d": ((7,), "contiguous"),
            "0d": ((), "contiguous"),
            "empty": ((0, 3), "contiguous"),
            "transposed": ((3, 4), "transposed"),
        }
        if d is dt.float32:
            shapes["large"] = ((257, 1031), "contiguous")
        for name, (shape, lay) in shapes.items():
            s[f"{approx}_{name}"] = mk(shape, lay, approx)
    return s


def _gelu_backward(d: dt.DType) -> dict[str, Builder]:
    def mk(shape: tuple[int, ...], lg: str, lx: str, approx: str) -> Builder:
        return lambda rng: Call([Out(shape, d), operand(rng, shape, d, lg), operand(rng, shape, d, lx), approx])

    s: dict[str, Builder] = {}
    for approx in ("tanh", "none"):
        s[f"{approx}_2d"] = mk((3, 4), "strided", "transposed", approx)
        s[f"{approx}_0d"] = mk((), "contiguous", "contiguous", approx)
    return s


def _softmax(d: dt.DType) -> dict[str, Builder]:
    def mk(shape: tuple[int, ...], dim: int, lay: str, scale: float = 1.0, neg_inf: bool = False) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            v = vals(rng, shape, d) * scale
            if neg_inf and v.size:
                v.reshape(-1, shape[-1])[:, 0] = -np.inf
            return Call([Out(shape, d), Operand(v, d, lay), dim])

        return build

    s = {"dim1": mk((3, 5), 1, "contiguous"), "dim0": mk((3, 5), 0, "transposed")}
    if d in FULL:
        s["3d_last"] = mk((2, 3, 4), 2, "transposed")
        s["3d_middle"] = mk((2, 3, 4), 1, "strided")
        s["large_values"] = mk((3, 5), 1, "contiguous", scale=400.0)
        s["neg_inf"] = mk((3, 5), 1, "contiguous", neg_inf=True)
        s["empty_rows"] = mk((0, 5), 1, "contiguous")
    if d is dt.float32:
        s["large"] = mk((257, 1031), 1, "contiguous")
    return s


def _layer_norm(d: dt.DType) -> dict[str, Builder]:
    def mk(shape: tuple[int, ...], lay: str, affine: bool) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            c = shape[-1]
            w = operand(rng, (c,), d) if affine else None
            b = operand(rng, (c,), d, "strided") if affine else None
            st = _stat(d)
            return Call(
                [Out(shape, d), Out(shape[:-1], st), Out(shape[:-1], st), operand(rng, shape, d, lay), w, b, 1e-5]
            )

        return build

    s = {"affine": mk((4, 6), "contiguous", True), "plain": mk((4, 6), "transposed", False)}
    if d in FULL:
        s["3d"] = mk((2, 3, 6), "strided", True)
        s["1d"] = mk((6,), "contiguous", True)
    if d is dt.float32:
        s["large"] = mk((256, 768), "contiguous", True)
    return s


def _layer_norm_backward(d: dt.DType) -> dict[str, Builder]:
    def mk(shape: tuple[int, ...], weight: bool, bias: bool, lay: str) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            c = shape[-1]
            x = vals(rng, shape, d)
            mu = x.mean(axis=-1)
            rstd = 1.0 / np.sqrt(x.var(axis=-1) + 1e-5)
            st = _stat(d)
            dw = Out((c,), d) if weight else None
            db = Out((c,), d) if bias else None
            w = operand(rng, (c,), d) if weight else None
            return Call(
                [
                    Out(shape, d),
                    dw,
                    db,
                    operand(rng, shape, d, lay),
                    Operand(x, d),
                    Operand(mu, st),
                    Operand(rstd, st),
                    w,
                ]
            )

        return build

    s = {"affine": mk((4, 6), True, True, "contiguous"), "plain": mk((4, 6), False, False, "transposed")}
    if d in FULL:
        s["weight_only"] = mk((2, 3, 6), True, False, "strided")
    return s


def _embedding(d: dt.DType) -> dict[str, Builder]:
    def mk(ids_shape: tuple[int, ...], lw: str, li: str) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            ids = Operand(vals(rng, ids_shape, dt.int64, "index:10"), dt.int64, li)
            return Call([Out(ids_shape + (4,), d), operand(rng, (10, 4), d, lw), ids])

        return build

    s = {"2d_ids": mk((2, 3), "contiguous", "contiguous"), "1d_ids": mk((5,), "transposed", "strided")}
    if d in FULL:
        s["0d_id"] = mk((), "contiguous", "contiguous")
        s["empty_ids"] = mk((0,), "contiguous", "contiguous")
    return s


def _cross_entropy(d: dt.DType) -> dict[str, Builder]:
    def mk(lay: str, smoothing: float, scale: float = 1.0, ignore: bool = True) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            t = vals(rng, (6,), dt.int64, "index:5")
            if ignore:
                t[2] = -100
            logits = Operand(vals(rng, (6, 5), d) * scale, d, lay)
            return Call([Out((6,), d), logits, Operand(t, dt.int64), -100, smoothing])

        return build

    s = {"plain": mk("contiguous", 0.0), "smoothing": mk("transposed", 0.1)}
    if d in FULL:
        s["large_logits"] = mk("strided", 0.0, scale=300.0, ignore=False)
    return s


def _attention(d: dt.DType) -> dict[str, Builder]:
    def mk(
        tq: int,
        tk: int,
        causal: bool,
        lengths: list[int] | None,
        lay: str = "contiguous",
        heads: int = 2,
        kv_heads: int = 2,
        dv: int = 4,
        window: int = 0,
    ) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            q = operand(rng, (2, heads, tq, 4), d, lay)
            k = operand(rng, (2, kv_heads, tk, 4), d, lay)
            v = operand(rng, (2, kv_heads, tk, dv), d, lay)
            ln = Operand(np.array(lengths, np.int64), dt.int64) if lengths is not None else None
            return Call([Out((2, heads, tq, dv), d), q, k, v, 0.5, causal, ln, *([window] if window else [])])

        return build

    s = {"full": mk(3, 5, False, None), "causal": mk(3, 5, True, None, HEADS)}
    # grouped-query attention: 4 query heads over 2 kv heads, multi-query (1 kv head)
    s["gqa_causal"] = mk(3, 5, True, None, HEADS, heads=4, kv_heads=2)
    s["mqa_decode"] = mk(1, 6, True, None, heads=4, kv_heads=1)
    # sliding windows (API 1.4): a prefill chunk after a cache, each query seeing its last 3 keys
    s["window_causal"] = mk(5, 7, True, None, HEADS, window=3)
    if d in FULL:
        s["window_decode_lengths"] = mk(1, 6, True, [4, 6], heads=4, kv_heads=2, window=2)
        s["window_one"] = mk(6, 6, True, None, "strided", window=1)
        s["causal_square"] = mk(4, 4, True, None, HEADS)
        s["decode"] = mk(1, 6, True, None)
        s["lengths"] = mk(3, 5, True, [5, 3], "strided")
        s["zero_length"] = mk(2, 5, False, [0, 5])
        s["gqa_full"] = mk(3, 5, False, None, heads=6, kv_heads=2, dv=3)
        s["gqa_lengths"] = mk(2, 5, True, [5, 2], "strided", heads=4, kv_heads=2)
        s["gqa_decode_lengths"] = mk(1, 5, True, [3, 5], HEADS, heads=6, kv_heads=3)
        s["mqa_transposed"] = mk(3, 4, False, None, "transposed", heads=3, kv_heads=1)
    return s


def _paged_attention(d: dt.DType) -> dict[str, Builder]:
    """Rows of different lengths whose blocks sit at shuffled ids of a pool with spare blocks."""

    def mk(
        heads: int,
        kv_heads: int,
        tq: int,
        s: int,
        lengths: list[int],
        lq: str = "contiguous",
        lc: str = "contiguous",
        lo: str = "contiguous",
        dim: int = 4,
        window: int = 0,
    ) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            b = len(lengths)
            need = [-(-n // s) for n in lengths]
            nb = sum(need) + 2
            ids = rng.permutation(nb)
            table = np.full((b, max(need) + 1), -1, np.int64)  # entries past a row's blocks are never read
            at = 0
            for r, k in enumerate(need):
                table[r, :k] = ids[at : at + k]
                at += k
            q = operand(rng, (b, heads, tq, dim), d, lq)
            cache = operand(rng, (nb, 2, kv_heads, s, dim), d, lc)
            lens = Operand(np.array(lengths, np.int64), dt.int64)
            table_op = Operand(table, dt.int64)
            return Call([Out((b, heads, tq, dim), d, lo), q, cache, table_op, lens, 0.5, *([window] if window else [])])

        return build

    s = {
        "decode": mk(4, 4, 1, 4, [5, 9, 1]),
        "gqa_decode": mk(4, 2, 1, 16, [17, 3]),
        "mqa_prefill": mk(4, 1, 3, 3, [3, 8], HEADS),
        # positions-major pool ([NB, 2, S, Hkv, D] storage), a prefill of 4 after 6 cached positions
        "gqa_prefill_after_cache": mk(4, 2, 4, 3, [10, 4], HEADS, "permute:0,1,3,2,4"),
        "window_decode": mk(4, 2, 1, 4, [13, 6], window=5),  # sliding window (API 1.4)
    }
    if d in FULL:
        s["window_prefill"] = mk(4, 2, 5, 3, [11, 5], HEADS, window=4)
        s["block_size_1"] = mk(2, 2, 2, 1, [6, 2])
        s["strided"] = mk(6, 3, 2, 4, [7, 4], "strided", "strided", "strided")
        s["whole_blocks"] = mk(2, 2, 3, 16, [16, 3], "transposed", dim=8)
    return s


def _rms_norm(d: dt.DType) -> dict[str, Builder]:
    def mk(shape: tuple[int, ...], lay: str, weight: str | None, eps: float = 1e-6) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            c = shape[-1]
            w = operand(rng, (c,), d, weight) if weight is not None else None
            st = _stat(d)
            return Call([Out(shape, d), Out(shape[:-1], st), operand(rng, shape, d, lay), w, eps])

        return build

    s = {"weight": mk((4, 6), "contiguous", "contiguous"), "plain": mk((4, 6), "transposed", None, 1e-5)}
    s["decode"] = mk((2, 1, 8), "contiguous", "contiguous")  # [B, T=1, C]
    if d in FULL:
        s["3d_strided"] = mk((2, 3, 6), "strided", "strided")
        s["1d"] = mk((6,), "contiguous", "contiguous")
        s["permuted"] = mk((3, 2, 5), "permute:1,0,2", "contiguous")
        s["large_eps"] = mk((3, 4), "contiguous", "contiguous", 0.5)
    if d is dt.float32:
        s["large"] = mk((64, 1024), "contiguous", "contiguous")
    return s


def _rope_tables(p: int, half: int, table: dt.DType) -> tuple[Operand, Operand]:
    freq = np.arange(p)[:, None] * 10000.0 ** (-np.arange(half) / half)
    return Operand(np.cos(freq), table), Operand(np.sin(freq), table)


def _rope(d: dt.DType) -> dict[str, Builder]:
    def mk(
        shape: tuple[int, int, int, int],
        lay: str,
        positions: str,
        table: dt.DType = dt.float32,
        p: int = 9,
        out: str = "contiguous",
    ) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            b, _, t, dh = shape
            cos, sin = _rope_tables(p, dh // 2, table)
            if positions == "arange":  # the prefill of a fresh sequence: 0..T-1 in every row
                pos = Operand(np.arange(t, dtype=np.int64), dt.int64, "broadcast", (b, t))
            elif positions == "offset":  # each row at its own KV-cache length
                start = rng.integers(0, p - t + 1, size=(b, 1))
                pos = Operand(start + np.arange(t), dt.int64, "strided")
            else:  # arbitrary (padded batches, reordered tokens)
                pos = Operand(vals(rng, (b, t), dt.int64, f"index:{p}"), dt.int64, "transposed")
            return Call([Out(shape, d, out), operand(rng, shape, d, lay), cos, sin, pos])

        return build

    s = {
        "prefill": mk((2, 3, 4, 8), "contiguous", "arange"),
        "decode_per_row": mk((3, 2, 1, 8), HEADS, "offset"),
    }
    if d in FULL:
        s["heads_permuted"] = mk((2, 3, 4, 6), HEADS, "random")
        s["strided_out"] = mk((2, 2, 3, 4), "strided", "offset", out="strided")
        s["table64"] = mk((1, 2, 5, 4), "contiguous", "random", dt.float64)
        s["d2"] = mk((2, 1, 3, 2), "transposed", "random")
    else:
        s["table64"] = mk((1, 2, 5, 4), "contiguous", "random", dt.float64)
    return s


def _topk(d: dt.DType) -> dict[str, Builder]:
    def mk(shape: tuple[int, ...], k: int, lay: str) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            x = operand(rng, shape, d, lay, "halves" if d.is_floating_point else "normal")
            return Call([Out(shape[:-1] + (k,), d), Out(shape[:-1] + (k,), dt.int64), x, k])

        return build

    s = {"k2": mk((3, 6), 2, "contiguous"), "k_all": mk((3, 6), 6, "transposed")}
    if d in FULL:
        s["1d"] = mk((9,), 3, "strided")
    return s


def _adamw(d: dt.DType) -> dict[str, Builder]:
    def mk(shape: tuple[int, ...], lay: str, wd: float, step: int) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            p = Out(shape, d, init=vals(rng, shape, d))
            m = Out(shape, d, init=vals(rng, shape, d) * 0.1)
            v = Out(shape, d, init=vals(rng, shape, d, "positive") * 0.01)
            return Call([p, operand(rng, shape, d, lay), m, v, 1e-3, 0.9, 0.999, 1e-8, wd, step])

        return build

    return {"1d": mk((7,), "contiguous", 0.01, 3), "2d_no_decay": mk((3, 4), "transposed", 0.0, 1)}


_BUILDERS: dict[str, tuple[Callable[[dt.DType], dict[str, Builder]], tuple[dt.DType, ...]]] = {
    "linear": (_linear, FLOATS),
    "gelu": (_gelu, FLOATS),
    "gelu_backward": (_gelu_backward, FLOATS),
    "softmax": (_softmax, FLOATS),
    "log_softmax": (_softmax, FLOATS),
    "layer_norm": (_layer_norm, FLOATS),
    "layer_norm_backward": (_layer_norm_backward, FLOATS),
    "embedding": (_embedding, FLOATS),
    "cross_entropy": (_cross_entropy, FLOATS),
    "attention": (_attention, FLOATS),
    "rms_norm": (_rms_norm, FLOATS),
    "rope": (_rope, FLOATS),
    "silu_mul": (gated_rows, FLOATS),
    "topk": (_topk, FLOATS + (dt.int64,)),
    "adamw_step": (_adamw, FULL),
    "paged_attention": (_paged_attention, FLOATS),
    **GEMMA_BUILDERS,
    **MOE_BUILDERS,
    **CONV_BUILDERS,
    **POOL_BUILDERS,
    **BATCH_NORM_BUILDERS,
}


def fused_cases() -> list[Case]:
    cases = []
    for op, (make, dtypes) in _BUILDERS.items():
        for d in dtypes:
            for name, b in make(d).items():
                cases.append(Case(op, d.name, name, b))
    return cases
