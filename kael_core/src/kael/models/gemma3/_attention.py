"""Gemma's attention over kael ops: ``attention`` with its sliding window, and Gemma 2's logit soft-capping,
which ``attention`` has no parameter for.

For one row, queries at positions S - T .. S - 1 attend to its keys at 0 .. S - 1 (the cached ones and the
T new ones). Query p sees key j when j <= p (causal) and, on a sliding layer of window w, j > p - w
(transformers' mask ``kv_idx > q_idx - sliding_window``: the last w positions, itself included).

NOTE [gemma attention paths]: without soft-capping (Gemma 3) ``attend`` is the fused ``attention`` op with
the layer's ``window`` (NOTE [sliding window] in kael/ops/_attention_fused.py), and the model's cache step
attends with ``step.attend(..., window=)``. With Gemma 2's soft-capping it decomposes:
``scores = q @ k^T * scale`` ([.., Hkv, G*T, S], the G = H / Hkv query heads of a key/value head stacked,
so keys are never repeated), ``softcap(scores, cap)``, the mask (``where``, -inf outside it), softmax,
``@ v``, as transformers' eager attention computes it. ``cached_keys`` writes a step's new keys and values
into the paged cache and returns each row's keys and values (a block released behind an all-sliding model's
window reads as the row's first held one, whose keys the mask drops: NOTE [sliding-window blocks] in
kael/models/_paged_cache.py).

NOTE [gemma query chunks]: the decomposition's scores are [.., G*T, S]; a prompt of more than ``QUERY_CHUNK``
new tokens is attended in chunks of that many queries, each over the keys it can see (a sliding layer's:
its first query's window to its last query, at most QUERY_CHUNK + w - 1 of them), so a long prompt costs
O(T * (chunk + w)) on a sliding layer and O(chunk * S) memory on a soft-capped full one. Positions shift
together, so each chunk is the same problem with its queries last among its keys.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import _dtype as dt
from ..._errors import KaelError
from ..._tensor import Tensor
from ...autograd import no_grad
from ...ops import (
    attention,
    cat,
    matmul,
    mul,
    narrow,
    reshape,
    select,
    softcap,
    softmax,
    tensor,
    transpose,
    unsqueeze,
    where,
)
from ...ops._inplace import copy_

__all__ = ["attend", "cached_keys", "window_mask", "QUERY_CHUNK"]

#: The most queries the decomposition scores at once (NOTE [gemma query chunks]).
QUERY_CHUNK = 256


def window_mask(t: int, s: int, window: int | None, device: Any) -> Tensor:
    """bool [T, S]: query i (position s - t + i) sees key j when j <= s - t + i and, with a window, j > s - t + i - window."""
    p = np.arange(s - t, s)[:, None]
    j = np.arange(s)[None, :]
    ok = j <= p
    if window is not None:
        ok &= j > p - window
    return tensor(ok, dtype=dt.bool_, device=device)


def attend(q: Tensor, k: Tensor, v: Tensor, scale: float, window: int | None, cap: float | None) -> Tensor:
    """q [B, H, T, D] at positions S - T .. S - 1 of k, v [B, Hkv, S, D] (every row at the same positions) ->
    [B, H, T, D] (NOTE [gemma attention paths])."""
    b, h, t, d = q.shape
    kv, s = k.shape[1], k.shape[2]
    if cap is None:
        return attention(q, k, v, causal=True, scale=scale, window=window)
    if t > QUERY_CHUNK:  # NOTE [gemma query chunks]
        outs = []
        for i0 in range(0, t, QUERY_CHUNK):
            n = min(QUERY_CHUNK, t - i0)
            end = s - t + i0 + n  # keys up to the chunk's last query
            first = max(0, end - n - window + 1) if window is not None else 0
            kc, vc = narrow(k, 2, first, end - first), narrow(v, 2, first, end - first)
            outs.append(attend(narrow(q, 2, i0, n), kc, vc, scale, window, cap))
        return cat(outs, 2)
    g = h // kv
    qg = reshape(q, b, kv, g * t, d)  # query head h = kv head h // g, group member h % g
    scores = mul(matmul(qg, transpose(k, 2, 3)), scale)  # [B, Hkv, G*T, S]
    scores = softcap(scores, cap)
    mask = window_mask(t, s, window, q.device)  # [T, S], broadcast over the G query heads of each group
    scores = reshape(where(mask, reshape(scores, b, kv, g, t, s), float("-inf")), b, kv, g * t, s)
    out: Tensor = reshape(matmul(softmax(scores, -1), v), b, h, t, d)
    return out


def cached_keys(step: Any, layer: int, k: Tensor, v: Tensor) -> list[tuple[Tensor, Tensor]]:
    """Write the new k, v [n, Hkv, T, D] of ``step``'s rows into its paged cache at the rows' slots; return each
    row's keys and values [1, Hkv, start + T, D] (views of the cache when a row holds one block)."""
    cache = getattr(step, "cache", None)
    if cache is None or not hasattr(step, "rows"):
        raise KaelError(
            f"Gemma attention needs a PagedStep (a cache step over a PagedKVCache), got {type(step).__name__}"
        )
    t, size = k.shape[2], cache.block_size
    buf = cache.data[layer]  # [NB, 2, Hkv, block, D]
    out = []
    with no_grad():
        for i, (r, start) in enumerate(zip(step.rows, step.starts)):
            table = cache.block_ids(r)
            for src, which in ((k, 0), (v, 1)):
                row = select(src, 0, i)  # [Hkv, T, D]
                p = start
                while p < start + t:
                    slot = p % size
                    n = min(size - slot, start + t - p)
                    dst = narrow(select(select(buf, 0, table[p // size]), 0, which), 1, slot, n)
                    copy_(dst, narrow(row, 1, p - start, n))
                    p += n
            end = start + t
            parts = [
                narrow(select(buf, 0, table[j]), 2, 0, min(size, end - j * size))
                for j in range((end + size - 1) // size)
            ]
            both = parts[0] if len(parts) == 1 else cat(parts, 2)  # [2, Hkv, end, D]
            out.append((unsqueeze(select(both, 0, 0), 0), unsqueeze(select(both, 0, 1), 0)))
    return out
