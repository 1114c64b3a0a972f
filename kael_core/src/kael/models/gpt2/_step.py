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

A quantized projection (``kael.quant.QuantizedLinear``) runs the ``quantized_linear``
kernel instead of ``linear``, and a quantized ``wte`` (``QuantizedTable``) is read with
``dequantize`` (one table row per token) and is the head's ``quantized_linear`` weight;
the step then also needs those kernels (``_steps.Proj``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

from ... import _dtype as dt
from ..._errors import ShapeError
from ..._tensor import Tensor
from ...ops._core import empty
from ...ops._views import make_view
from .._steps import Proj, projection, step_kernels, weight_kernels

if TYPE_CHECKING:
    from .._kv_cache import KVCache
    from ._model import GPT

__all__ = ["GPT2DecodeStep"]

_FUSED = ("layer_norm", "linear", "gelu")


class _Layer(NamedTuple):
    """One layer's tensors as the step consumes them (projections: [out, in] weights and their scheme)."""

    ln_1_w: Tensor
    ln_1_b: Tensor
    attn: Proj
    attn_proj: Proj
    ln_2_w: Tensor
    ln_2_b: Tensor
    fc: Proj
    mlp_proj: Proj


def _layers(model: GPT) -> list[_Layer]:
    out = []
    for blk in model.h:
        a, m = blk.attn, blk.mlp
        out.append(
            _Layer(
                blk.ln_1.weight,
                blk.ln_1.bias,
                projection(a.c_attn),
                projection(a.c_proj),
                blk.ln_2.weight,
                blk.ln_2.bias,
                projection(m.c_fc),
                projection(m.c_proj),
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
        self.wte_scheme: str | None = getattr(model.wte, "scheme", None)
        self.head = Proj(self.wte, None, self.wte_scheme)
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
        kernels = step_kernels(model.device.type, (*_FUSED, cache.attention_op, *weight_kernels(model)))
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
        layer_norm, add_k, gelu = k["layer_norm"], k["add"], k["gelu"]
        linear = k["project"]  # linear or quantized_linear by the projection's scheme (_steps.Proj)
        n, c, h, d, eps = len(rows), self.c, self.h, self.d, self.eps
        pos = [cache.lengths[r] for r in rows]
        if max(pos) >= cache.max_positions:
            raise ShapeError(f"GPT2DecodeStep: a row is past the cache's {cache.max_positions} positions (at {pos})")
        x, norm, mean, rstd, qkv, att_flat, proj, hidden, act, logits, logits2 = self.views(n)
        s3 = 3 * c
        if self.wte_scheme is None:
            for i, (t, s) in enumerate(zip(tokens, pos)):
                add_k(_row(self.x, i, c), _table_row(self.wte, t, c), _table_row(self.wpe, s, c))
        else:  # dequantize the token's row of blocks into the residual row, then add the position
            dequantize, wte, row = k["dequantize"], self.wte, self.wte._strides[0]
            for i, (t, s) in enumerate(zip(tokens, pos)):
                x_row = _row(self.x, i, c)
                dequantize(
                    make_view(x_row, (1, c), (c, 1), x_row._offset),
                    make_view(wte, (1, wte.shape[1]), (row, wte._strides[1]), wte._offset + t * row),
                    self.wte_scheme,
                )
                add_k(x_row, x_row, _table_row(self.wpe, s, c))
        # Per-row views of the step's queries, new keys/values and attention output.
        ctx, scale = cache.decode_context(rows, pos), self.scale
        qs = [make_view(self.qkv, (1, h, 1, d), (s3, d, s3, 1), i * s3) for i in range(n)]
        kvs = [make_view(self.qkv, (1, 2, h, 1, d), (s3, c, d, s3, 1), i * s3 + c) for i in range(n)]
        atts = [make_view(self.att, (1, h, 1, d), (c, d, d, 1), i * c) for i in range(n)]
        q_all = make_view(self.qkv, (n, h, 1, d), (s3, d, s3, 1), 0)  # the same rows, as one view each
        att_all = make_view(self.att, (n, h, 1, d), (c, d, d, 1), 0)
        for li, w in enumerate(self.layers):
            layer_norm(norm, mean, rstd, x, w.ln_1_w, w.ln_1_b, eps)
            linear(qkv, norm, w.attn)
            cache.attend_rows(k, li, ctx, qs, kvs, atts, scale, q_all, att_all)
            linear(proj, att_flat, w.attn_proj)
            add_k(x, x, proj)
            layer_norm(norm, mean, rstd, x, w.ln_2_w, w.ln_2_b, eps)
            linear(hidden, norm, w.fc)
            gelu(act, hidden, "tanh")
            linear(proj, act, w.mlp_proj)
            add_k(x, x, proj)
        layer_norm(norm, mean, rstd, x, self.ln_f_w, self.ln_f_b, eps)
        linear(logits, norm, self.head)
        cache.bump_versions()
        self.logits._bump_version()
        return logits2


def _row(t: Tensor, i: int, c: int) -> Tensor:
    """Row i of an [n, 1, c] buffer as a [1, 1, c] view."""
    return make_view(t, (1, 1, c), (c, c, 1), t._offset + i * c)


def _table_row(t: Tensor, index: int, c: int) -> Tensor:
    """Row ``index`` of a 2-d table as a [1, 1, c] view."""
    return make_view(t, (1, 1, c), (0, 0, t._strides[1]), t._offset + index * t._strides[0])
