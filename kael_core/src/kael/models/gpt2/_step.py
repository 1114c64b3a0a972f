"""``GPT2DecodeStep``: GPT-2's one-token decode step for 1 to N cache rows, with no per-step allocation.

Decoding reads every weight once per token, so its speed is memory bandwidth plus the
Python spent per step. The general forward pass (``CausalLMBase.run``) makes about
twenty frontend calls per layer, each validating its operands, allocating its output
and making views. Here every buffer (residual, norm output, qkv, attention output, MLP
hidden, logits) is allocated once for all the cache's rows and its views of the first n
rows are made once per n (NOTE [decode buffers] in ``_decode_buffers.py``), and a step calls the backend's kernels directly (NOTE [kernel
contract] in kael/_ops.py), batched over the step's rows except where a row reads its
own cache:

    layer_norm -> linear(c_attn) -> per row: copy(new k, v into its cache row), attention
    -> linear(attn.c_proj) -> add(residual) -> layer_norm -> linear(c_fc) -> gelu
    -> linear(mlp.c_proj) -> add(residual)

With ``KAEL_GELU=ggml`` (read at every step) the gelu is ggml's float16 table instead (NOTE [ggml GELU
table] in ``kael/ops/_gelu_ggml.py``), computed by frontend ops and copied into the step's buffer.

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

from ... import _dispatch
from ..._tensor import Tensor
from ...ops._gelu_ggml import ggml_gelu, ggml_gelu_tanh
from ...ops._views import make_view
from .._decode_buffers import DecodeBuffers, View
from .._steps import Proj, gather_rows, in_waves, projection, step_kernels, step_positions, weight_kernels

if TYPE_CHECKING:
    from .._paged_cache import PagedKVCache
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
    """One new token for each of a set of ``cache``'s rows (a ``kael.models.DecodeStep``), or tokens at
    given positions (NOTE [entries at positions] in ``_steps.py``)."""

    takes_positions = True

    def __init__(self, model: GPT, cache: PagedKVCache, kernels: dict[str, Any]) -> None:
        cfg = model.config
        c, h, d, n = cfg.dimension, cfg.heads, cfg.head_dim, cache.step_rows
        dev, dtype = model.device, model.dtype
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
        s3 = 3 * c
        # NOTE [decode buffers]: every activation, one row per sequence of the step, and the views the
        # kernels take: the queries and new keys/values inside qkv, the attention output flat, the logits 2-d.
        self.buf = DecodeBuffers(
            n,
            dtype,
            dev,
            {
                "x": (1, c),
                "norm": (1, c),
                "mean": (1,),
                "rstd": (1,),
                "qkv": (1, s3),
                "att": (h, 1, d),
                "proj": (1, c),
                "hidden": (1, 4 * c),
                "act": (1, 4 * c),
                "logits": (1, model.vocab_size),
            },
            stats=("mean", "rstd"),
            views={
                "x2": View("x", (c,), (1,)),
                "q": View("qkv", (h, 1, d), (d, s3, 1)),
                "kv": View("qkv", (2, h, 1, d), (c, d, s3, 1), c),
                "att_flat": View("att", (1, c), (c, 1)),
                "logits2": View("logits", (model.vocab_size,), (1,)),
            },
        )

    @classmethod
    def create(cls, model: GPT, cache: PagedKVCache) -> GPT2DecodeStep | None:
        """A step over ``cache``, or None when the model's backend lacks a fused kernel it calls."""
        kernels = step_kernels(model.device.type, (*_FUSED, cache.attention_op, *weight_kernels(model)))
        return None if kernels is None else cls(model, cache, kernels)

    def __call__(self, rows: list[int], tokens: list[int], positions: list[int] | None = None) -> Tensor:
        """Logits [len(rows), V] after ``tokens[i]`` in row ``rows[i]`` (at ``positions[i]``, default its
        cached length; a view the next call overwrites)."""
        cache, k = self.cache, self.k
        layer_norm, add_k, gelu = k["layer_norm"], k["add"], k["gelu"]
        n, c, eps = len(rows), self.c, self.eps
        pos = step_positions("GPT2DecodeStep", cache, rows, positions)
        # linear or quantized_linear by the projection's scheme (_steps.Proj); entries in waves of 16 rows
        linear = k["project"] if positions is None else in_waves(k["project"], n)
        v, buf = self.buf.views(n), self.buf
        x, norm, mean, rstd, qkv, att_flat = v["x"], v["norm"], v["mean"], v["rstd"], v["qkv"], v["att_flat"]
        proj, hidden, act, logits = v["proj"], v["hidden"], v["act"], v["logits"]
        x_rows = buf.rows(n, "x")
        if self.wte_scheme is None and gather_rows(x, self.wte, tokens) and gather_rows(proj, self.wpe, pos):
            add_k(x, x, proj)
        elif self.wte_scheme is None:
            for i, (t, s) in enumerate(zip(tokens, pos)):
                add_k(x_rows[i], _table_row(self.wte, t, c), _table_row(self.wpe, s, c))
        else:  # dequantize the token's row of blocks into the residual row, then add the position
            dequantize, wte, row = k["dequantize"], self.wte, self.wte._strides[0]
            x2_rows = buf.rows(n, "x2")
            for i, (t, s) in enumerate(zip(tokens, pos)):
                dequantize(
                    x2_rows[i],
                    make_view(wte, (1, wte.shape[1]), (row, wte._strides[1]), wte._offset + t * row),
                    self.wte_scheme,
                )
                add_k(x_rows[i], x_rows[i], _table_row(self.wpe, s, c))
        # Per-row views of the step's queries, new keys/values and attention output, and the same rows as one view each.
        ctx, scale = cache.decode_context(rows, pos), self.scale
        qs, kvs, atts = buf.rows(n, "q"), buf.rows(n, "kv"), buf.rows(n, "att")
        q_all, att_all = v["q"], v["att"]
        copy = _dispatch.kernel(hidden.device.type, "copy") if ggml_gelu(hidden) else None
        for li, w in enumerate(self.layers):
            layer_norm(norm, mean, rstd, x, w.ln_1_w, w.ln_1_b, eps)
            linear(qkv, norm, w.attn)
            cache.attend_rows(k, li, ctx, qs, kvs, atts, scale, q_all, att_all)
            linear(proj, att_flat, w.attn_proj)
            add_k(x, x, proj)
            layer_norm(norm, mean, rstd, x, w.ln_2_w, w.ln_2_b, eps)
            linear(hidden, norm, w.fc)
            if copy is None:
                gelu(act, hidden, "tanh")
            else:  # KAEL_GELU=ggml
                copy(act, ggml_gelu_tanh(hidden))
            linear(proj, act, w.mlp_proj)
            add_k(x, x, proj)
        layer_norm(norm, mean, rstd, x, self.ln_f_w, self.ln_f_b, eps)
        linear(logits, norm, self.head)
        cache.bump_versions()
        buf["logits"]._bump_version()
        return v["logits2"]


def _table_row(t: Tensor, index: int, c: int) -> Tensor:
    """Row ``index`` of a 2-d table as a [1, 1, c] view."""
    return make_view(t, (1, 1, c), (0, 0, t._strides[1]), t._offset + index * t._strides[0])
