"""``Decoder``: GPT-2's one-token decode step with no per-step allocation.

Decoding reads every weight once per token, so its speed is memory bandwidth plus
the Python spent per step. The general forward pass (``GPT.run``) makes about twenty
frontend calls per layer, each validating its operands, allocating its output and
making views; for GPT-2 small that costs milliseconds per token. Here every buffer
(residual, norm output, qkv, attention output, MLP hidden, logits) is allocated once
per ``generate`` call, every fixed view of them is made once, and a step calls the
backend's kernels directly, eleven per layer (NOTE [kernel contract] in kael/_ops.py):

    layer_norm -> linear(c_attn) -> copy(new k, v into the cache) -> attention
    -> linear(attn.c_proj) -> add(residual) -> layer_norm -> linear(c_fc) -> gelu
    -> linear(mlp.c_proj) -> add(residual)

Only the views that move with the position (the cache slot written and the keys read)
are made per step, as plain strided views. It serves batch 1 with a ``KVCache`` under
no_grad; ``Decoder.create`` returns None when the backend lacks one of the fused ops,
and ``generate`` then uses the general forward pass, which decomposes them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .. import _dispatch
from .. import _dtype as dt
from .._tensor import Tensor
from ..ops._core import empty
from ..ops._views import make_view

if TYPE_CHECKING:
    from ._gpt2 import GPT, Plan
    from ._kv_cache import KVCache

__all__ = ["Decoder"]

_FUSED = ("layer_norm", "linear", "gelu", "attention")


def _row(t: Tensor, index: int, n: int) -> Tensor:
    """Row ``index`` of a 2-d tensor as a [1, 1, n] view."""
    return make_view(t, (1, 1, n), (0, 0, t._strides[1]), t._offset + index * t._strides[0])


class Decoder:
    """Runs one token at a time through ``model``, reading and extending ``cache`` (batch 1)."""

    def __init__(self, model: GPT, plan: Plan, cache: KVCache, kernels: dict[str, Any]) -> None:
        cfg = model.config
        c, h, d = cfg.dimension, cfg.heads, cfg.head_dim
        dev, dtype = model.device, model.dtype
        stat = dt.float64 if dtype is dt.float64 else dt.float32
        self.plan, self.cache, self.k = plan, cache, kernels
        self.c, self.h, self.d = c, h, d
        self.eps, self.scale = cfg.layer_norm_epsilon, 1.0 / math.sqrt(d)
        self.x = empty((1, 1, c), dtype, dev)  # the residual stream
        self.norm = empty((1, 1, c), dtype, dev)
        self.mean, self.rstd = empty((1, 1), stat, dev), empty((1, 1), stat, dev)
        self.qkv = empty((1, 1, 3 * c), dtype, dev)
        s = 3 * c
        self.q = make_view(self.qkv, (1, h, 1, d), (s, d, s, 1), 0)  # [B, H, T, D]
        self.kv = make_view(self.qkv, (1, 2, h, 1, d), (s, c, d, s, 1), c)  # new keys and values [B, 2, H, T, D]
        self.att = empty((1, h, 1, d), dtype, dev)
        self.att_flat = make_view(self.att, (1, 1, c), (c, c, 1), 0)
        self.proj = empty((1, 1, c), dtype, dev)
        self.hidden = empty((1, 1, 4 * c), dtype, dev)
        self.act = empty((1, 1, 4 * c), dtype, dev)
        self.logits = empty((1, 1, model.vocab_size), dtype, dev)
        self.logits_row = make_view(self.logits, (model.vocab_size,), (1,), 0)

    @classmethod
    def create(cls, model: GPT, plan: Plan, cache: KVCache) -> Decoder | None:
        """A Decoder, or None when the model's backend lacks a fused kernel it calls."""
        dev = model.device.type
        kernels = {op: _dispatch.fused_kernel(dev, op) for op in _FUSED}
        if any(k is None for k in kernels.values()) or cache.batch != 1:
            return None
        kernels["copy"] = _dispatch.kernel(dev, "copy")
        kernels["add"] = _dispatch.kernel(dev, "add")
        return cls(model, plan, cache, kernels)

    def __call__(self, token: int) -> Tensor:
        """Logits [V] after ``token`` (a view of a buffer that the next call overwrites)."""
        cache, p, k = self.cache, self.plan, self.k
        layer_norm, linear, copy, attention, add, gelu = (
            k["layer_norm"],
            k["linear"],
            k["copy"],
            k["attention"],
            k["add"],
            k["gelu"],
        )
        pos = cache.lengths[0]
        n = pos + 1
        if n > cache.max_positions:
            from .._errors import ShapeError

            raise ShapeError(f"Decoder: position {pos} is past the cache's {cache.max_positions} positions")
        c, eps = self.c, self.eps
        x, norm, mean, rstd, qkv, att, proj = self.x, self.norm, self.mean, self.rstd, self.qkv, self.att, self.proj
        add(x, _row(p.wte, token, c), _row(p.wpe, pos, c))
        for i, w in enumerate(p.layers):
            layer_norm(norm, mean, rstd, x, w.ln_1_w, w.ln_1_b, eps)
            linear(qkv, norm, w.attn_w, w.attn_b)
            buf = cache.data[i]  # [B, 2, H, P, D]
            st = buf._strides
            copy(make_view(buf, (1, 2, self.h, 1, self.d), st, buf._offset + pos * st[3]), self.kv)
            kst = (st[0], st[2], st[3], st[4])
            keys = make_view(buf, (1, self.h, n, self.d), kst, buf._offset)
            values = make_view(buf, (1, self.h, n, self.d), kst, buf._offset + st[1])
            attention(att, self.q, keys, values, self.scale, True, None)
            linear(proj, self.att_flat, w.attn_proj_w, w.attn_proj_b)
            add(x, x, proj)
            layer_norm(norm, mean, rstd, x, w.ln_2_w, w.ln_2_b, eps)
            linear(self.hidden, norm, w.fc_w, w.fc_b)
            gelu(self.act, self.hidden, "tanh")
            linear(proj, self.act, w.mlp_proj_w, w.mlp_proj_b)
            add(x, x, proj)
        layer_norm(norm, mean, rstd, x, p.ln_f_w, p.ln_f_b, eps)
        linear(self.logits, norm, p.wte, None)
        for b in cache.data:  # written in place, like an in-place op would
            b._storage.version += 1
        self.logits._storage.version += 1
        cache.lengths = [n]
        return self.logits_row
