"""``LlamaDecodeStep``: the Llama family's one-token decode step for 1 to N cache rows, no per-step allocation.

The same design as ``GPT2DecodeStep`` (``kael/models/gpt2/_step.py``): every activation
buffer is allocated once for all the cache's rows, views of the first n rows are made
once per n (NOTE [decode buffers] in ``_decode_buffers.py``), and a step calls the
backend's kernels directly (NOTE [kernel contract] in kael/_ops.py), batched over
the step's rows except where a row reads its own cache:

    rms_norm -> linear(q_proj, k_proj, v_proj) [-> rms_norm(q_norm), rms_norm(k_norm) per head: qk_norm]
    -> rope(q), rope(k) at each row's position (copy(q), copy(k) on a layer without rope: SmolLM3)
    -> per row: copy(new k, v into its cache row), attention (GQA: Hkv cached heads)
    -> linear(o_proj) -> add(residual) -> rms_norm -> linear(gate_proj, up_proj)
    -> silu_mul -> linear(down_proj) -> add(residual)
    then rms_norm(norm) -> linear(lm_head)

With ``multipliers`` (Granite, ``kael/models/granite/_step.py``): mul(embedding), mul(o_proj and down_proj
outputs) before each residual add, div(logits), and ``scale`` the attention's softmax scale.

When a layer's q/k/v (or gate/up) parameters are adjacent row blocks of one buffer (NOTE
[fused projections] in ``_checkpoint.py``), they run as one product into one output
buffer, whose q, k and v (gate and up) parts the next kernels read as views.

Buffer layout: the rotated keys and the values of a step share one ``kv`` buffer
``[n, 2, Hkv, 1, D]`` (``rope`` writes k into its first half, ``v_proj`` its output into
the second), so one copy per row writes both into its block of the cache's ``[N, 2, Hkv, S, D]``
layer buffer (NOTE [paged kv cache]). Positions are a view of an ``arange`` table when
the rows' positions are evenly spaced (always for one row), else a small int64 tensor.

The row-wise ops see activations as ``[n, 1, C]``, one ``[1, C]`` row per sequence, so a
backend whose products round a row the same way whatever the row count gives each row
exactly its logits alone (NOTE [batched = alone] in ``kael/models/_batched.py``).
``create`` returns None when the backend lacks one of the fused ops (``fused_ops``); callers
then use the generic step over the model's modules, which decomposes them. A family whose
MLP differs overrides ``mlp`` (the normalised rows into ``proj``) and ``read_layers`` (its
layers' MLP weights left out of ``_Layer``: Qwen3-MoE's sparse layers, ``kael/models/qwen3_moe/_step.py``).

A quantized projection (``kael.quant.QuantizedLinear``) runs the ``quantized_linear``
kernel instead of ``linear`` (q/k/v or gate/up in one weight format fuse the same way:
their rows of blocks are adjacent), and a quantized ``embed_tokens`` (``QuantizedTable``)
is read with ``dequantize``, one table row per token (``_steps.Proj``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

from ... import _dtype as dt
from ..._tensor import Tensor
from ...ops import arange, tensor
from ...ops._attention_fused import takes_window
from ...ops._views import make_view
from .._decode_buffers import DecodeBuffers, View
from .._steps import Proj, gather_rows, in_waves, projection, step_kernels, step_positions, weight_kernels

if TYPE_CHECKING:
    from .._paged_cache import PagedKVCache
    from ._model import LlamaForCausalLM

__all__ = ["LlamaDecodeStep", "Multipliers"]

_FUSED = ("rms_norm", "linear", "rope", "silu_mul")


class _Layer(NamedTuple):
    """One layer's weights as the step consumes them (projections as ``Proj``: [out, in] or a weight format).

    qkv / gate_up: the fused [(H + 2 Hkv) * D, C] / [2F, C] projections when the parts are
    adjacent (and in one format), else None (and the separate ones are used). gate / up / down:
    None (and gate_up None) on a layer whose MLP is not SwiGLU projections, which the step's
    ``mlp`` override runs (Qwen3-MoE's sparse layers). q_norm / k_norm:
    the per-head RMSNorm weights [D] of a ``qk_norm`` config (Qwen3), else None. rope: whether the layer
    rotates q and k (``LlamaAttention.rope``; off on SmolLM3's no-rope layers).
    """

    qkv: Proj | None
    gate_up: Proj | None
    in_norm: Tensor
    q: Proj
    k: Proj
    v: Proj
    o: Proj
    post_norm: Tensor
    gate: Proj | None
    up: Proj | None
    down: Proj | None
    q_norm: Tensor | None
    k_norm: Tensor | None
    rope: bool
    window: int = 0  # a sliding-window layer's window (LlamaAttention.window), 0 for none


class Multipliers(NamedTuple):
    """0-d tensors in the step's dtype: the embedding's and each residual branch's factor, the logits' divisor."""

    embedding: Tensor
    residual: Tensor
    logits: Tensor


def _adjacent(ts: list[Tensor | None]) -> Tensor | None:
    """The tensors as one view when they are consecutive row blocks of one contiguous buffer, else None."""
    if any(t is None for t in ts):
        return None
    parts = [t for t in ts if t is not None]
    first = parts[0]
    row = math.prod(first.shape[1:])
    offset = first._offset
    for t in parts:
        if t._storage is not first._storage or t.dtype is not first.dtype or not t.is_contiguous():
            return None
        if t.shape[1:] != first.shape[1:] or t._offset != offset:
            return None
        offset += t.shape[0] * row
    shape = (sum(t.shape[0] for t in parts), *first.shape[1:])
    strides = (row, 1) if len(shape) == 2 else (1,)
    return make_view(first, shape, strides, first._offset)


def _fused(parts: list[Proj]) -> Proj | None:
    """The fused projection of ``parts`` (one format, adjacent weights and biases), or None."""
    scheme = parts[0].scheme
    if any(p.scheme != scheme for p in parts):
        return None
    w = _adjacent([p.weight for p in parts])
    if w is None:
        return None
    bs = [p.bias for p in parts]
    if all(b is None for b in bs):
        return Proj(w, None, scheme)
    b = _adjacent(bs)
    return Proj(w, b, scheme) if b is not None else None


def _layer(blk: Any, dense: bool = True) -> _Layer:
    """One decoder layer's weights; ``dense`` False leaves out its MLP (gate, up, down, gate_up None)."""
    a = blk.self_attn
    q, k, v = projection(a.q_proj), projection(a.k_proj), projection(a.v_proj)
    gate = up = down = gate_up = None
    if dense:
        m = blk.mlp
        gate, up, down = projection(m.gate_proj), projection(m.up_proj), projection(m.down_proj)
        gate_up = _fused([gate, up])
    return _Layer(
        _fused([q, k, v]),
        gate_up,
        blk.input_layernorm.weight,
        q,
        k,
        v,
        projection(a.o_proj),
        blk.post_attention_layernorm.weight,
        gate,
        up,
        down,
        a.q_norm.weight if a.qk_norm else None,
        a.k_norm.weight if a.qk_norm else None,
        a.rope,
        a.window or 0,
    )


def _first(t: Tensor, n: int) -> Tensor:
    """The first n rows (dim 0) of a buffer."""
    return make_view(t, (n, *t.shape[1:]), t._strides, t._offset)


class LlamaDecodeStep:
    """One new token for each of a set of ``cache``'s rows (a ``kael.models.DecodeStep``), or tokens at
    given positions (NOTE [entries at positions] in ``_steps.py``)."""

    takes_positions = True

    #: The fused ops the step calls (besides the cache's attention op and the weight formats' kernels).
    fused_ops: tuple[str, ...] = _FUSED

    def __init__(self, model: LlamaForCausalLM, cache: PagedKVCache, kernels: dict[str, Any]) -> None:
        cfg = model.config
        c, h, kv, d, f, n = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.kv_heads,
            cfg.dim,
            cfg.intermediate_size,
            cache.step_rows,
        )
        dev, dtype = model.device, model.dtype
        self.layers, self.cache, self.k = self.read_layers(model), cache, kernels
        self.linear: Any = kernels["project"]
        """The projection runner of the call in progress (``in_waves`` for entries at positions)."""
        self.embed, self.norm_w = model.model.embed_tokens.weight, model.model.norm.weight
        self.embed_scheme: str | None = getattr(model.model.embed_tokens, "scheme", None)
        head = model.head
        self.head = Proj(head.weight, None, getattr(head, "scheme", None))
        self.cos, self.sin = model.rope_tables()
        self.c, self.h, self.kvh, self.d, self.f, self.v = c, h, kv, d, f, model.vocab_size
        self.eps, self.scale = cfg.rms_norm_eps, 1.0 / math.sqrt(d)
        self.multipliers: Multipliers | None = None  # set by a family that scales (Granite); needs mul, div
        self.arange = arange(cache.max_positions, dtype=dt.int64, device=dev)
        kvw, w3 = 2 * kv * d, (h + 2 * kv) * d
        # qk_norm (Qwen3): q and k normalised per head into qn / kn (statistics [n, H(kv), 1]), then rotated.
        heads_norm = {"qn": (h, 1, d), "kn": (kv, 1, d), "qrstd": (h, 1), "krstd": (kv, 1)} if cfg.qk_norm else {}
        # NOTE [decode buffers]: every activation, one row per sequence of the step, and the views the
        # kernels take of them (q, k, v as heads; the parts of the fused q/k/v and gate/up products).
        self.buf = DecodeBuffers(
            n,
            dtype,
            dev,
            {
                "x": (1, c),  # the residual stream
                "norm": (1, c),
                "rstd": (1,),
                "q": (1, h * d),
                "qrot": (h, 1, d),
                "kraw": (1, kv * d),
                "kv": (2, kv, 1, d),  # the rotated keys and the values, as the cache takes them
                "qkv": (1, w3),  # the fused q/k/v product
                "gate_up": (1, 2 * f),  # the fused gate/up product
                "att": (h, 1, d),
                "proj": (1, c),
                "gate": (1, f),
                "up": (1, f),
                "act": (1, f),
                "logits": (1, model.vocab_size),
                **heads_norm,
            },
            stats=("rstd", "qrstd", "krstd"),
            views={
                "x2": View("x", (c,), (1,)),
                "q4": View("q", (h, 1, d), (d, h * d, 1)),  # q as [n, H, 1, D]
                "k4": View("kraw", (kv, 1, d), (d, kv * d, 1)),  # k as [n, Hkv, 1, D]
                "krot": View("kv", (kv, 1, d), (d, d, 1)),  # kv[:, 0]: the rotated keys
                "vout": View("kv", (1, kv * d), (kvw, 1), kv * d),  # kv[:, 1] as v_proj's output
                "att_flat": View("att", (1, h * d), (h * d, 1)),
                "logits2": View("logits", (model.vocab_size,), (1,)),
                "q4f": View("qkv", (h, 1, d), (d, w3, 1)),
                "k4f": View("qkv", (kv, 1, d), (d, w3, 1), h * d),
                "vf": View("qkv", (1, kv * d), (w3, 1), (h + kv) * d),
                "gate_f": View("gate_up", (1, f), (2 * f, 1)),
                "up_f": View("gate_up", (1, f), (2 * f, 1), f),
            },
        )

    def read_layers(self, model: LlamaForCausalLM) -> list[_Layer]:
        """Each layer's weights as the step consumes them (a family whose layers hold other modules overrides it)."""
        return [_layer(blk) for blk in model.model.layers]

    @classmethod
    def create(cls, model: LlamaForCausalLM, cache: PagedKVCache) -> LlamaDecodeStep | None:
        """A step over ``cache``, or None when the model's backend lacks a fused kernel it calls."""
        kernels = step_kernels(model.device.type, (*cls.fused_ops, cache.attention_op, *weight_kernels(model)))
        if kernels is not None and any(getattr(blk.self_attn, "window", None) for blk in model.model.layers):
            if not takes_window(model.device.type):  # a backend before API 1.4: the generic step
                return None
        return None if kernels is None else cls(model, cache, kernels)

    def rotate(self, out: Tensor, x: Tensor, where: Tensor) -> None:
        """The ``rope`` kernel: x [n, H(kv), 1, D] rotated at the table rows ``where`` into ``out`` (a family that
        rotates only part of each head overrides it: Phi-3)."""
        self.k["rope"](out, x, self.cos, self.sin, where)

    def positions(self, pos: list[int]) -> Tensor:
        """The rows' positions as int64 [n, 1]: a view of the arange table when evenly spaced."""
        n, p0 = len(pos), pos[0]
        step = pos[1] - p0 if n > 1 else 0
        if step >= 0 and all(p == p0 + i * step for i, p in enumerate(pos)):
            return make_view(self.arange, (n, 1), (step, 1), p0)
        return tensor([[p] for p in pos], dtype=dt.int64, device=self.arange.device)

    def embed_rows(self, tokens: list[int]) -> None:
        """Row i of the residual buffer ``x`` := the embedding of ``tokens[i]`` (dequantized from a weight format)."""
        n, c, emb, buf, k = len(tokens), self.c, self.embed, self.buf, self.k
        if self.embed_scheme is None and gather_rows(buf.views(n)["x"], emb, tokens):
            return
        if self.embed_scheme is None:
            for i, t in enumerate(tokens):
                k["copy"](
                    buf.rows(n, "x")[i],
                    make_view(emb, (1, 1, c), (0, 0, emb._strides[1]), emb._offset + t * emb._strides[0]),
                )
        else:  # dequantize each token's row of blocks into its residual row
            dequantize, row, width = k["dequantize"], emb._strides[0], emb.shape[1]
            for i, t in enumerate(tokens):
                dequantize(
                    buf.rows(n, "x2")[i],
                    make_view(emb, (1, width), (row, emb._strides[1]), emb._offset + t * row),
                    self.embed_scheme,
                )

    def mlp(self, li: int, w: _Layer, v: dict[str, Tensor], n: int) -> None:
        """Layer ``li``'s MLP of the normalised rows ``v["norm"]`` into ``v["proj"]`` (``v``: the buffers' views of
        the step's ``n`` rows): linear(gate, up) -> silu_mul -> linear(down). A family with another MLP
        overrides it (Qwen3-MoE's sparse layers)."""
        linear, silu_mul, norm, act = self.linear, self.k["silu_mul"], v["norm"], v["act"]
        if w.gate_up is not None:
            linear(v["gate_up"], norm, w.gate_up)
            silu_mul(act, v["gate_f"], v["up_f"])
        else:
            linear(v["gate"], norm, w.gate)
            linear(v["up"], norm, w.up)
            silu_mul(act, v["gate"], v["up"])
        linear(v["proj"], act, w.down)

    def __call__(self, rows: list[int], tokens: list[int], positions: list[int] | None = None) -> Tensor:
        """Logits [len(rows), V] after ``tokens[i]`` in row ``rows[i]`` (at ``positions[i]``, default its
        cached length; a view the next call overwrites)."""
        cache, k = self.cache, self.k
        rms_norm = k["rms_norm"]
        copy, add_k = k["copy"], k["add"]
        n, c, eps = len(rows), self.c, self.eps
        pos = step_positions(type(self).__name__, cache, rows, positions)
        # linear or quantized_linear by the projection's scheme (_steps.Proj); entries in waves of 16 rows
        linear = self.linear = k["project"] if positions is None else in_waves(k["project"], n)
        v, buf = self.buf.views(n), self.buf
        x, norm, rstd, q, q4, qrot, kraw = v["x"], v["norm"], v["rstd"], v["q"], v["q4"], v["qrot"], v["kraw"]
        k4, krot, vout, att_flat, proj = v["k4"], v["krot"], v["vout"], v["att_flat"], v["proj"]
        logits, qkv, q4f, k4f, vf = v["logits"], v["qkv"], v["q4f"], v["k4f"], v["vf"]
        where = self.positions(pos)
        self.embed_rows(tokens)
        m = self.multipliers
        if m is not None:  # Granite: the factors broadcast (stride 0) over the rows they scale
            mul = k["mul"]
            emb_m, res_m = (make_view(f, (n, 1, c), (0, 0, 0), f._offset) for f in m[:2])
            mul(x, x, emb_m)
        # Per-row views of the step's queries, new keys/values and attention output, and the same rows as one view each.
        kvs, qs, atts = buf.rows(n, "kv"), buf.rows(n, "qrot"), buf.rows(n, "att")
        q_all, att_all = v["qrot"], v["att"]
        scale = self.scale
        ctx = cache.decode_context(rows, pos)
        for li, w in enumerate(self.layers):
            rms_norm(norm, rstd, x, w.in_norm, eps)
            if w.qkv is not None:
                linear(qkv, norm, w.qkv)
                copy(vout, vf)
                q_in, k_in = q4f, k4f
            else:
                linear(q, norm, w.q)
                linear(kraw, norm, w.k)
                linear(vout, norm, w.v)
                q_in, k_in = q4, k4
            if w.q_norm is not None and w.k_norm is not None:  # per head, over D (qk_norm)
                rms_norm(v["qn"], v["qrstd"], q_in, w.q_norm, eps)
                rms_norm(v["kn"], v["krstd"], k_in, w.k_norm, eps)
                q_in, k_in = v["qn"], v["kn"]
            if w.rope:
                self.rotate(qrot, q_in, where)
                self.rotate(krot, k_in, where)
            else:  # a no-rope layer (SmolLM3): q and k as they are, into the buffers attention reads
                copy(qrot, q_in)
                copy(krot, k_in)
            cache.attend_rows(k, li, ctx, qs, kvs, atts, scale, q_all, att_all, w.window)
            linear(proj, att_flat, w.o)
            if m is not None:
                mul(proj, proj, res_m)
            add_k(x, x, proj)
            rms_norm(norm, rstd, x, w.post_norm, eps)
            self.mlp(li, w, v, n)
            if m is not None:
                mul(proj, proj, res_m)
            add_k(x, x, proj)
        rms_norm(norm, rstd, x, self.norm_w, eps)
        linear(logits, norm, self.head)
        if m is not None:
            k["div"](logits, logits, make_view(m.logits, logits.shape, (0, 0, 0), m.logits._offset))
        cache.bump_versions()
        buf["logits"]._bump_version()
        return v["logits2"]
