"""One row's distribution: log-softmax, the top-k / top-p / min-p rule, softmax and the draw.

NOTE [one top-k rule]: top-k keeps every logit at or above the k-th largest, ties at the k-th
kept, as Hugging Face's ``TopKLogitsWarper`` (``scores < topk(scores, k).values[..., -1]`` are
removed) and vLLM's sampler (logits below the k-th of the sorted row are masked) both do.
Without ties this is exactly PyTorch's ``topk`` followed by ``softmax`` and ``multinomial``
over the k kept values; with ties at the k-th logit it keeps them all rather than an
arbitrary k. Every probability is computed in float64 on the host copy of the logits, and a
token is drawn by the inverse CDF (over token ids in order) of ONE uniform float64 from the
request's generator, so 0 < top_k < V, top_p < 1 and min_p > 0 are the only settings that
change a seeded draw: ``top_p`` absent or 1, ``top_k`` 0, -1 or >= V give the same tokens.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _dtype as dt
from .._errors import KaelError, ShapeError
from ..ops import Generator, rand

__all__ = ["draw", "filter_row", "log_softmax", "row", "softmax", "top_logprobs"]

_NEG_INF = -math.inf


def row(logits: object, op: str) -> np.ndarray:
    """One row of logits [V] as a fresh float64 array (the caller's logits stay as they were)."""
    a = np.array(logits, dtype=np.float64)
    if a.ndim != 1 or a.shape[0] == 0:
        raise ShapeError(f"{op}: logits must be one row [V] with V >= 1, got shape {list(a.shape)}")
    return a


def log_softmax(logits: object) -> np.ndarray:
    """log(softmax(logits)) of one row [V] in float64 (max-subtracted: no overflow)."""
    x = row(logits, "log_softmax")
    m = np.max(x)
    if not np.isfinite(m):
        raise KaelError(f"log_softmax: the logits have no finite maximum (max {float(m)!r})")
    shifted = x - m
    result: np.ndarray = shifted - np.log(np.sum(np.exp(shifted)))
    return result


def top_logprobs(logprobs: np.ndarray, n: int) -> tuple[tuple[int, float], ...]:
    """The ``n`` largest entries of a row of log-probabilities as (token id, value), largest first,
    ties broken by the lower id."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise KaelError(f"top_logprobs: n must be an int >= 0, got {n!r}")
    v = logprobs.shape[0]
    n = min(n, v)
    if n == 0:
        return ()
    ids = np.arange(v) if n == v else np.argpartition(-logprobs, n - 1)[:n]
    # argpartition may leave out some of several equal values at the cut: take every tie, then sort.
    cut = logprobs[ids].min()
    ids = np.flatnonzero(logprobs >= cut)
    order = np.lexsort((ids, -logprobs[ids]))[:n]
    return tuple((int(ids[i]), float(logprobs[ids[i]])) for i in order)


def filter_row(x: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """``x / temperature`` with the tokens that top-k (NOTE [one top-k rule]), top-p and min-p
    drop set to -inf, in that order (vLLM's); a new array."""
    x = x / float(temperature)
    v = x.shape[0]
    if 0 < top_k < v:
        kth = np.partition(x, v - top_k)[v - top_k]
        x[x < kth] = _NEG_INF
    if top_p < 1:
        order = np.argsort(-x, kind="stable")
        probs = softmax(x[order])
        before = np.concatenate(([0.0], np.cumsum(probs)[:-1]))  # probability of the likelier tokens
        x[order[before >= top_p]] = _NEG_INF
    if min_p > 0:
        probs = softmax(x)
        x[probs < min_p * probs.max()] = _NEG_INF
    return x


def softmax(x: np.ndarray) -> np.ndarray:
    """softmax of processed logits in float64; +inf ones (a tiny repetition penalty can make them)
    share all the probability, as the limit of ever larger logits would."""
    m = np.max(x)
    if np.isnan(m) or m == _NEG_INF:
        raise KaelError(f"sampling: the logits give no valid distribution (max logit {float(m)!r})")
    e = (x == m).astype(np.float64) if m == math.inf else np.exp(x - m)
    result: np.ndarray = e / e.sum()
    return result


def draw(probs: np.ndarray, generator: Generator | None, op: str) -> int:
    """One index drawn from the (unnormalised) probabilities ``probs`` [V] by the inverse CDF of a
    single uniform float64 from ``generator`` (kael's default generator when None)."""
    cdf = np.cumsum(probs)
    if not np.isfinite(cdf[-1]) or cdf[-1] <= 0:
        raise KaelError(f"{op}: the logits give no valid distribution (sum of probabilities {cdf[-1]!r})")
    dev = generator.device if generator is not None else None
    u = float(rand(1, dtype=dt.float64, device=dev, generator=generator).item())
    # side="right" skips zero-probability tokens (flat stretches of the cdf); the clamp keeps a draw
    # that rounds onto the end on the last token that can be drawn.
    j = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    if j < probs.shape[0] and probs[j] > 0:  # a drawable token: at or before the last one
        return j
    return min(j, int(np.flatnonzero(probs)[-1]))
