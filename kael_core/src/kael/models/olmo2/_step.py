"""``Olmo2DecodeStep``: ``LlamaDecodeStep``'s buffers and kernels in OLMo 2's layer order.

Per layer, on the backend's primitive kernels, one row per sequence of the step (``[n, 1, width]``):

    linear(q_proj, k_proj, v_proj) of the residual x itself (fused when adjacent)
    -> rms_norm(q [n, 1, H*D], q_norm), rms_norm(k [n, 1, Hkv*D], k_norm)   (whole projection)
    -> rope(q, k viewed as heads [n, H(kv), 1, D]) -> per row: copy into the cache, attention
    -> linear(o_proj) -> rms_norm(post_attention_layernorm) -> add(residual)
    -> linear(gate_proj, up_proj) of x -> silu_mul -> linear(down_proj)   (LlamaDecodeStep.mlp, over x)
    -> rms_norm(post_feedforward_layernorm) -> add(residual)
    then rms_norm(norm) -> linear(lm_head)

NOTE [olmo2 step layers]: the step's per-layer weights are Llama's ``_Layer`` tuples with OLMo 2's
norms in its norm slots: ``in_norm`` holds ``post_attention_layernorm`` (applied to o_proj's output,
not to the layer's input), ``post_norm`` ``post_feedforward_layernorm`` (applied to down_proj's
output), ``q_norm`` / ``k_norm`` the whole-projection weights [H*D] / [Hkv*D]; ``rope`` is always on.
The rms_norm kernel normalises over the last dim, so the whole-projection norm is that kernel on the
flat [n, 1, H*D] projection, written to its own buffer which rope then reads as heads (NOTE
[whole-projection q/k norm] in ``_model.py``): the same kernels on the same operands as the
generic forward, so each row's logits are the model's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._tensor import Tensor
from ...ops._views import make_view
from .._decode_buffers import DecodeBuffers, View
from .._steps import in_waves, projection, step_positions
from ..llama import LlamaDecodeStep
from ..llama._step import _fused, _Layer

if TYPE_CHECKING:
    from .._paged_cache import PagedKVCache
    from ..llama import LlamaForCausalLM

__all__ = ["Olmo2DecodeStep"]


class Olmo2DecodeStep(LlamaDecodeStep):
    """One new token for each of a set of ``cache``'s rows of an ``Olmo2ForCausalLM``."""

    def __init__(self, model: LlamaForCausalLM, cache: PagedKVCache, kernels: dict[str, Any]) -> None:
        super().__init__(model, cache, kernels)
        h, kv, d = self.h, self.kvh, self.d
        # The normalised q and k ([n, 1, H(kv)*D]; statistics [n, 1]) and the same as heads [n, H(kv), 1, D].
        self.qk_buf = DecodeBuffers(
            cache.step_rows,
            model.dtype,
            model.device,
            {"qn": (1, h * d), "kn": (1, kv * d), "qrstd": (1,), "krstd": (1,)},
            stats=("qrstd", "krstd"),
            views={"qn4": View("qn", (h, 1, d), (d, h * d, 1)), "kn4": View("kn", (kv, 1, d), (d, kv * d, 1))},
        )
        self._fused_qk: dict[int, tuple[Tensor, Tensor]] = {}

    def read_layers(self, model: LlamaForCausalLM) -> list[_Layer]:
        """Each layer's weights, OLMo 2's norms in the tuple's norm slots (NOTE [olmo2 step layers])."""
        out = []
        for blk in model.model.layers:
            a, m = blk.self_attn, blk.mlp
            q, k, v = projection(a.q_proj), projection(a.k_proj), projection(a.v_proj)
            gate, up = projection(m.gate_proj), projection(m.up_proj)
            out.append(
                _Layer(
                    _fused([q, k, v]),
                    _fused([gate, up]),
                    blk.post_attention_layernorm.weight,
                    q,
                    k,
                    v,
                    projection(a.o_proj),
                    blk.post_feedforward_layernorm.weight,
                    gate,
                    up,
                    projection(m.down_proj),
                    a.q_norm.weight,
                    a.k_norm.weight,
                    True,
                )
            )
        return out

    def _qk_parts(self, n: int, qkv: Tensor) -> tuple[Tensor, Tensor]:
        """The q and k parts [n, 1, H*D] and [n, 1, Hkv*D] of the fused q/k/v product (made once per n)."""
        got = self._fused_qk.get(n)
        if got is None:
            h, kv, d = self.h, self.kvh, self.d
            strides = qkv._strides
            got = (
                make_view(qkv, (n, 1, h * d), strides, qkv._offset),
                make_view(qkv, (n, 1, kv * d), strides, qkv._offset + h * d),
            )
            self._fused_qk[n] = got
        return got

    def __call__(self, rows: list[int], tokens: list[int], positions: list[int] | None = None) -> Tensor:
        """Logits [len(rows), V] after ``tokens[i]`` in row ``rows[i]`` (at ``positions[i]``, default its
        cached length; a view the next call overwrites)."""
        cache, k = self.cache, self.k
        rms_norm, rope, copy, add = k["rms_norm"], k["rope"], k["copy"], k["add"]
        n, eps = len(rows), self.eps
        pos = step_positions("Olmo2DecodeStep", cache, rows, positions)
        # linear or quantized_linear by the projection's scheme (_steps.Proj); entries in waves of 16 rows
        linear = self.linear = k["project"] if positions is None else in_waves(k["project"], n)
        v, o, buf = self.buf.views(n), self.qk_buf.views(n), self.buf
        x, norm, rstd, qkv, proj = v["x"], v["norm"], v["rstd"], v["qkv"], v["proj"]
        mlp_in = {**v, "norm": x}  # the MLP (LlamaDecodeStep.mlp, over v["norm"]) reads the residual itself
        qn, kn, qrstd, krstd, qn4, kn4 = o["qn"], o["kn"], o["qrstd"], o["krstd"], o["qn4"], o["kn4"]
        where = self.positions(pos)
        self.embed_rows(tokens)
        kvs, qs, atts = buf.rows(n, "kv"), buf.rows(n, "qrot"), buf.rows(n, "att")
        q_all, att_all, qrot, krot = v["qrot"], v["att"], v["qrot"], v["krot"]
        cos, sin, scale = self.cos, self.sin, self.scale
        ctx = cache.decode_context(rows, pos)
        for li, w in enumerate(self.layers):
            if w.qkv is not None:
                linear(qkv, x, w.qkv)
                copy(v["vout"], v["vf"])
                q_in, k_in = self._qk_parts(n, qkv)
            else:
                linear(v["q"], x, w.q)
                linear(v["kraw"], x, w.k)
                linear(v["vout"], x, w.v)
                q_in, k_in = v["q"], v["kraw"]
            assert w.q_norm is not None and w.k_norm is not None
            rms_norm(qn, qrstd, q_in, w.q_norm, eps)  # over the whole projection (NOTE [olmo2 step layers])
            rms_norm(kn, krstd, k_in, w.k_norm, eps)
            rope(qrot, qn4, cos, sin, where)
            rope(krot, kn4, cos, sin, where)
            cache.attend_rows(k, li, ctx, qs, kvs, atts, scale, q_all, att_all)
            linear(proj, v["att_flat"], w.o)
            rms_norm(norm, rstd, proj, w.in_norm, eps)  # post_attention_layernorm
            add(x, x, norm)
            self.mlp(li, w, mlp_in, n)  # into proj
            rms_norm(norm, rstd, proj, w.post_norm, eps)  # post_feedforward_layernorm
            add(x, x, norm)
        rms_norm(norm, rstd, x, self.norm_w, eps)
        linear(v["logits"], norm, self.head)
        cache.bump_versions()
        buf["logits"]._bump_version()
        return v["logits2"]
