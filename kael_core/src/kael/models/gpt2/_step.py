"""``GPT2DecodeStep``: GPT-2's one-token decode step for 1 to N cache rows, with no per-step allocation.

Decoding reads every weight once per token, so its speed is memory bandwidth plus the
Python spent per step. The general forward pass (``CausalLMBase.run``) makes about
twenty frontend calls per layer, each validating its operands, allocating its output
and making views. Here every buffer (residual, norm output, qkv, attention output, MLP
hidden, logits) is allocated once for all the cache's rows, views of the first n rows
are made once per n, and a step calls the backend's kernels directly (NOTE [kernel
contract] in kael/_ops.py), batched over the step's rows except where a row reads its
own cache:

    layer_norm -> linear(c_attn) -> per row: copy(new k, v into its cache row), attention
    -> linear(attn.c_proj) -> add(residual) -> layer_norm -> linear(c_fc) -> gelu
    -> linear(mlp.c_proj) -> add(residual)

The row-wise ops see the activations as ``[n, 1, C]``, one ``[1, C]`` row per sequence,
so a backend whose products round a row the same way whatever the row count gives each
row exactly its logits alone (NOTE [batched = alone] in ``kael/models/_batched.py``).
``generate`` runs it with n = 1 over a one-row cache; ``BatchDecoder`` with any n.
``create`` returns None when the backend lacks one of the fused ops, and callers then
use the generic step over the model's own modules, which decomposes them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

from ... import _dtype as dt
from ..._errors import ShapeError
from ..._tensor import Tensor
from ...ops._core import empty
from ...ops._views import make_view
from .._steps import step_kernels

if TYPE_CHECKING:
    from .._kv_cache import KVCache
    from ._model import GPT

__all__ = ["GPT2DecodeStep"]

_FUSED = ("layer_norm", "linear", "gelu", "attention")


class _Layer(NamedTuple):
    """One layer's tensors as the step consumes them (projections as [out, in] views)."""

    ln_1_w: Tensor
    ln_1_b: Tensor
    attn_w: Tensor
    attn_b: Tensor
    attn_proj_w: Tensor
    attn_proj_b: Tensor
    ln_2_w: Tensor
    ln_2_b: Tensor
    fc_w: Tensor
    fc_b: Tensor
    mlp_proj_w: Tensor
    mlp_proj_b: Tensor


def _out_in(w: Tensor) -> Tensor:
    """A Conv1D weight [in, out] as the [out, in] view ``linear`` takes."""
    return make_view(w, (w.shape[1], w.shape[0]), (w._strides[1], w._strides[0]), w._offset)


def _layers(model: GPT) -> list[_Layer]:
    out = []
    for blk in model.h:
        a, m = blk.attn, blk.mlp
        out.append(
            _Layer(
                blk.ln_1.weight,
                blk.ln_1.bias,
                _out_in(a.c_attn.weight),
                a.c_attn.bias,
                _out_in(a.c_proj.weight),
                a.c_proj.bias,
                blk.ln_2.weight,
                blk.ln_2.bias,
                _out_in(m.c_fc.weight),
                m.c_fc.bias,
                _out_in(m.c_proj.weight),
                m.c_proj.bias,
            )
        )
    return out


class GPT2DecodeStep:
    """One new token for each of a set of ``cache``'s rows (a ``kael.models.DecodeStep``)."""

    def __init__(self, model: GPT, cache: KVCache, kernels: dict[str, Any]) -> None:
        cfg = model.config
        c, h, d, n = cfg.dimension, cfg.heads, cfg.head_dim, cache.batch
        dev, dtype = model.device, model.dtype
        stat = dt.float64 if dtype is dt.float64 else dt.float32
        self.layers, self.cache, self.k = _layers(model), cache, kernels
        self.wte, self.wpe, self.ln_f_w, self.ln_f_b = (
            model.wte.weight,
            model.wpe.weight,
            model.ln_f.weight,
            model.ln_f.bias,
        )
        self.c, self.h, self.d, self.v = c, h, d, model.vocab_size
        self.eps, self.scale = cfg.layer_norm_epsilon, 1.0 / math.sqrt(d)
        self.x = empty((n, 1, c), dtype, dev)  # the residual stream, one row per sequence of the step
        self.norm = empty((n, 1, c), dtype, dev)
        self.mean, self.rstd = empty((n, 1), stat, dev), empty((n, 1), stat, dev)
        self.qkv = empty((n, 1, 3 * c), dtype, dev)
        self.att = empty((n, h, 1, d), dtype, dev)
        self.proj = empty((n, 1, c), dtype, dev)
        self.hidden = empty((n, 1, 4 * c), dtype, dev)
        self.act = empty((n, 1, 4 * c), dtype, dev)
        self.logits = empty((n, 1, model.vocab_size), dtype, dev)
        self._views: dict[int, tuple[Tensor, ...]] = {}

    @classmethod
    def create(cls, model: GPT, cache: KVCache) -> GPT2DecodeStep | None:
        """A step over ``cache``, or None when the model's backend lacks a fused kernel it calls."""
        kernels = step_kernels(model.device.type, _FUSED)
        return None if kernels is None else cls(model, cache, kernels)

    def views(self, n: int) -> tuple[Tensor, ...]:
        """The first n rows of every buffer (made once per n)."""
        got = self._views.get(n)
        if got is None:
            c = self.c

            def first(t: Tensor) -> Tensor:
                return make_view(t, (n, *t.shape[1:]), t._strides, t._offset)

            att_flat = make_view(self.att, (n, 1, c), (c, c, 1), 0)
            logits2 = make_view(self.logits, (n, self.v), (self.v, 1), 0)
            got = (
                first(self.x),
                first(self.norm),
                first(self.mean),
                first(self.rstd),
                first(self.qkv),
                att_flat,
                first(self.proj),
                first(self.hidden),
                first(self.act),
                first(self.logits),
                logits2,
            )
            self._views[n] = got
        return got

    def __call__(self, rows: list[int], tokens: list[int]) -> Tensor:
        """Logits [len(rows), V] after ``tokens[i]`` in row ``rows[i]`` (a view the next call overwrites)."""
        cache, k = self.cache, self.k
        layer_norm, linear, copy, attention_k, add_k, gelu = (
            k["layer_norm"],
            k["linear"],
            k["copy"],
            k["attention"],
            k["add"],
            k["gelu"],
        )
        n, c, h, d, eps = len(rows), self.c, self.h, self.d, self.eps
        pos = [cache.lengths[r] for r in rows]
        if max(pos) >= cache.max_positions:
            raise ShapeError(f"GPT2DecodeStep: a row is past the cache's {cache.max_positions} positions (at {pos})")
        x, norm, mean, rstd, qkv, att_flat, proj, hidden, act, logits, logits2 = self.views(n)
        s3 = 3 * c
        for i, (t, s) in enumerate(zip(tokens, pos)):
            add_k(_row(self.x, i, c), _table_row(self.wte, t, c), _table_row(self.wpe, s, c))
        # Per-row views of the step's queries, new keys/values and attention output.
        qs = [make_view(self.qkv, (1, h, 1, d), (s3, d, s3, 1), i * s3) for i in range(n)]
        kvs = [make_view(self.qkv, (1, 2, h, 1, d), (s3, c, d, s3, 1), i * s3 + c) for i in range(n)]
        atts = [make_view(self.att, (1, h, 1, d), (c, d, d, 1), i * c) for i in range(n)]
        for li, w in enumerate(self.layers):
            layer_norm(norm, mean, rstd, x, w.ln_1_w, w.ln_1_b, eps)
            linear(qkv, norm, w.attn_w, w.attn_b)
            buf = cache.data[li]  # [B, 2, H, P, D]
            st = buf._strides
            kst = (st[0], st[2], st[3], st[4])
            for i, (r, s) in enumerate(zip(rows, pos)):
                base = buf._offset + r * st[0]
                copy(make_view(buf, (1, 2, h, 1, d), st, base + s * st[3]), kvs[i])
                keys = make_view(buf, (1, h, s + 1, d), kst, base)
                values = make_view(buf, (1, h, s + 1, d), kst, base + st[1])
                attention_k(atts[i], qs[i], keys, values, self.scale, True, None)
            linear(proj, att_flat, w.attn_proj_w, w.attn_proj_b)
            add_k(x, x, proj)
            layer_norm(norm, mean, rstd, x, w.ln_2_w, w.ln_2_b, eps)
            linear(hidden, norm, w.fc_w, w.fc_b)
            gelu(act, hidden, "tanh")
            linear(proj, act, w.mlp_proj_w, w.mlp_proj_b)
            add_k(x, x, proj)
        layer_norm(norm, mean, rstd, x, self.ln_f_w, self.ln_f_b, eps)
        linear(logits, norm, self.wte, None)
        for b in cache.data:  # written in place, like an in-place op would
            b._bump_version()
        self.logits._bump_version()
        return logits2


def _row(t: Tensor, i: int, c: int) -> Tensor:
    """Row i of an [n, 1, c] buffer as a [1, 1, c] view."""
    return make_view(t, (1, 1, c), (c, c, 1), t._offset + i * c)


def _table_row(t: Tensor, index: int, c: int) -> Tensor:
    """Row ``index`` of a 2-d table as a [1, 1, c] view."""
    return make_view(t, (1, 1, c), (0, 0, t._strides[1]), t._offset + index * t._strides[0])
