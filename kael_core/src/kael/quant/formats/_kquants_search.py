"""The scale searches of ggml's K-quant reference quantizers, vectorized over groups.

NOTE [bit-exact K-quant search]
===============================
llama.cpp's reference quantizers (``quantize_row_q*_K_ref`` in ``ggml-quants.c``, what
``llama-quantize`` runs without an importance matrix) choose each group's scale (and
minimum) by a small search over candidate scales, accumulating float32 sums one value at a
time. The functions here take many groups at once (rows of a [m, n] float32 array) and
follow the same arithmetic: every sum runs over the n values in order, in float32, with
each product evaluated left to right as the C source writes it (ggml's base library is
built without FMA contraction), and ``nearest_int`` is ggml's add-1.5*2^23 trick (round half
to even, with its wrap-around outside +-2^22). Ties and strict comparisons (the first value
of largest magnitude, ``>`` vs ``>=``) follow the C code, so the chosen levels are the same
bytes llama.cpp writes. Facts used: ``nearest_int``, ``make_qx_quants`` (rmse_type 1, no
weights), ``make_q3_quants`` (do_rmse), ``make_qkx2_quants`` and ``GROUP_MAX_EPS`` = 1e-15.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

__all__ = [
    "F32",
    "GROUP_MAX_EPS",
    "by_chunks",
    "nearest_int",
    "first_largest",
    "make_qx_quants",
    "make_q3_quants",
    "make_qkx2_quants",
]

F32 = np.float32
"""Shorthand for float32 constants (every constant of the C code is a float literal)."""

GROUP_MAX_EPS = F32(1e-15)
"""ggml's threshold below which a group counts as all zero."""

_MAGIC = F32(12582912.0)  # 1.5 * 2**23
_CHUNK_VALUES = 1 << 22  # values per chunk: bounds the searches' [groups, n] temporaries to ~16 MiB each


def by_chunks(quantize: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """Run a block quantizer on runs of blocks of at most ~4M values (blocks are independent), joining the bytes."""

    @functools.wraps(quantize)
    def run(x: np.ndarray, *args: object) -> np.ndarray:
        step = max(1, _CHUNK_VALUES // max(1, x.shape[1]))
        if x.shape[0] <= step:
            return quantize(x, *args)
        return np.concatenate([quantize(x[i : i + step], *args) for i in range(0, x.shape[0], step)])

    return run


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: the low 23 bits of ``v + 1.5*2^23`` (float32) minus 2^22, as int32."""
    with np.errstate(invalid="ignore", over="ignore"):
        s = (np.asarray(v, dtype=F32) + _MAGIC).astype(F32)
    out: np.ndarray = (s.view(np.int32) & np.int32(0x007FFFFF)) - np.int32(0x00400000)
    return out


def first_largest(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of [m, n]: (largest |x|, the first x of that magnitude), both float32 [m].

    As C's ``if (fabsf(x[i]) > amax)`` from amax = max = 0: NaN never wins, and a row without a
    nonzero value gives (0, 0).
    """
    a = np.abs(x)
    a = np.where(np.isnan(a), F32(-1), a)
    idx = np.argmax(a, axis=1)[:, None]
    amax = np.take_along_axis(a, idx, axis=1)[:, 0]
    found = amax > 0
    mx = np.where(found, np.take_along_axis(x, idx, axis=1)[:, 0], F32(0)).astype(F32)
    return np.where(found, amax, F32(0)).astype(F32), mx


def _div(a: np.ndarray | np.floating, b: np.ndarray | np.floating) -> np.ndarray:
    """a / b in float32, silencing the divisions whose results the caller masks away."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out: np.ndarray = np.asarray(a / b, dtype=F32)
    return out


def _mul(*factors: np.ndarray | np.floating) -> np.ndarray:
    """The float32 product of `factors`, evaluated left to right (overflow to inf as C)."""
    out = np.asarray(factors[0], dtype=F32)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        for f in factors[1:]:
            out = np.asarray(out * f, dtype=F32)
    return out


def _seq_sum(t: np.ndarray) -> np.ndarray:
    """Sum over the columns of [m, n] one at a time in float32 (C's loop order)."""
    acc = np.zeros(t.shape[0], F32)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(t.shape[1]):
            acc = (acc + t[:, i]).astype(F32)
    return acc


def _sums(w: np.ndarray, x: np.ndarray, lv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sum of w*x*l, sum of w*l*l) per row, products left to right, sums in order (C's loops)."""
    lf = lv.astype(F32)
    return _seq_sum(_mul(w, x, lf)), _seq_sum(_mul(w, lf, lf))


def make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL)`` on every row of [m, n].

    Returns (scale [m] float32, L [m, n] int32 in 0..2*nmax-1); all-zero rows give 0 and L = 0.
    """
    amax, mx = first_largest(x)
    zero = amax < GROUP_MAX_EPS
    fn = F32(nmax)
    w = _mul(x, x)

    def levels(iscale: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.clip(nearest_int(_mul(iscale[:, None], x)), -nmax, nmax - 1)
        return out

    iscale = _div(-fn, mx)
    lv = levels(iscale)
    sumlx, suml2 = _sums(w, x, lv)
    scale = np.where(suml2 != 0, _div(sumlx, suml2), F32(0)).astype(F32)
    best = _mul(scale, sumlx)
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = _div(-(fn + F32(0.1) * F32(step)), mx)
        cand = levels(iscale)
        sx, s2 = _sums(w, x, cand)
        better = (s2 > 0) & (_mul(sx, sx) > _mul(best, s2))
        lv = np.where(better[:, None], cand, lv)
        scale = np.where(better, _div(sx, s2), scale).astype(F32)
        best = np.where(better, _mul(scale, sx), best).astype(F32)
    lv = np.where(zero[:, None], 0, lv + nmax)
    return np.where(zero, F32(0), scale).astype(F32), lv.astype(np.int32)


def make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``make_q3_quants(n, nmax, x, L, do_rmse=true)`` on every row of [m, n].

    Returns (scale [m] float32, L [m, n] int32 in 0..2*nmax-1); all-zero rows give 0 and L = 0.
    The coordinate descent (up to 5 passes, one value at a time) runs on all rows together; a
    row stops after the first pass that changed nothing, as in the C loop.
    """
    m, n = x.shape
    amax, mx = first_largest(x)
    zero = amax < GROUP_MAX_EPS
    iscale = _div(F32(-nmax), mx)
    lv = np.clip(nearest_int(_mul(iscale[:, None], x)), -nmax, nmax - 1).astype(np.int32)
    w = _mul(x, x)
    wx = _mul(w, x)
    sumlx, suml2 = _sums(w, x, lv)
    active = ~zero
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for _ in range(5):
            changed = np.zeros(m, bool)
            for i in range(n):
                li = lv[:, i].astype(F32)
                slx = (sumlx - _mul(wx[:, i], li)).astype(F32)
                sl2 = (suml2 - _mul(w[:, i], li, li)).astype(F32)
                new = np.clip(nearest_int(_div(_mul(x[:, i], sl2), slx)), -nmax, nmax - 1)
                nf = new.astype(F32)
                slx2 = (slx + _mul(wx[:, i], nf)).astype(F32)
                sl22 = (sl2 + _mul(w[:, i], nf, nf)).astype(F32)
                take = active & (slx > 0) & (new != lv[:, i]) & (sl22 > 0)
                take &= _mul(slx2, slx2, suml2) > _mul(sumlx, sumlx, sl22)
                lv[:, i] = np.where(take, new, lv[:, i])
                sumlx = np.where(take, slx2, sumlx).astype(F32)
                suml2 = np.where(take, sl22, suml2).astype(F32)
                changed |= take
            active &= changed
            if not active.any():
                break
    scale = np.where(suml2 > 0, _div(sumlx, suml2), F32(0)).astype(F32)
    lv = np.where(zero[:, None], 0, lv + nmax)
    return np.where(zero, F32(0), scale).astype(F32), lv.astype(np.int32)


def make_qkx2_quants(
    x: np.ndarray, weights: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int, use_mad: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's ``make_qkx2_quants`` on every row of [m, n] with per-value `weights` [m, n].

    Returns (scale [m], the_min [m] (the negated offset, >= 0), L [m, n] int32 in 0..nmax).
    """
    n = x.shape[1]
    lo, hi = x[:, 0].copy(), x[:, 0].copy()
    sum_w = weights[:, 0].copy()
    sum_x = _mul(sum_w, x[:, 0])
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(1, n):
            lo = np.where(x[:, i] < lo, x[:, i], lo)
            hi = np.where(x[:, i] > hi, x[:, i], hi)
            sum_w = (sum_w + weights[:, i]).astype(F32)
            sum_x = (sum_x + _mul(weights[:, i], x[:, i])).astype(F32)
    lo = np.where(lo > 0, F32(0), lo).astype(F32)
    flat = hi == lo

    def levels(iscale: np.ndarray, mn: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            xs = (x - mn[:, None]).astype(F32)
        out: np.ndarray = np.clip(nearest_int(_mul(iscale[:, None], xs)), 0, nmax)
        return out

    def span(mn: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            out: np.ndarray = (hi - mn).astype(F32)
        return out

    def error(scale: np.ndarray, mn: np.ndarray, lv: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            diff = ((_mul(scale[:, None], lv.astype(F32)) + mn[:, None]).astype(F32) - x).astype(F32)
        diff = np.abs(diff) if use_mad else _mul(diff, diff)
        return _seq_sum(_mul(weights, diff))

    iscale = _div(F32(nmax), span(lo))
    scale = _div(F32(1), iscale)
    lv = levels(iscale, lo)
    best_error = error(scale, lo, lv)
    mn = lo  # the C loop's `min`: later steps measure from the best offset so far
    for step in range(nstep + 1):
        iscale = _div((F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)).astype(F32), span(mn))
        cand = levels(iscale, mn)
        cf = cand.astype(F32)
        wl = _mul(weights, cf)
        sum_l, sum_l2, sum_xl = _seq_sum(wl), _seq_sum(_mul(wl, cf)), _seq_sum(_mul(wl, x))
        big_d = (_mul(sum_w, sum_l2) - _mul(sum_l, sum_l)).astype(F32)
        this_scale = _div((_mul(sum_w, sum_xl) - _mul(sum_x, sum_l)).astype(F32), big_d)
        this_min = _div((_mul(sum_l2, sum_x) - _mul(sum_l, sum_xl)).astype(F32), big_d)
        pos = this_min > 0
        this_scale = np.where(pos, _div(sum_xl, sum_l2), this_scale).astype(F32)
        this_min = np.where(pos, F32(0), this_min).astype(F32)
        cur = error(this_scale, this_min, cand)
        better = (big_d > 0) & (cur < best_error)
        lv = np.where(better[:, None], cand, lv)
        best_error = np.where(better, cur, best_error).astype(F32)
        scale = np.where(better, this_scale, scale).astype(F32)
        mn = np.where(better, this_min, mn).astype(F32)
    lv = np.where(flat[:, None], 0, lv).astype(np.int32)
    scale = np.where(flat, F32(0), scale).astype(F32)
    mn = np.where(flat, lo, mn).astype(F32)
    return scale, (-mn).astype(F32), lv
