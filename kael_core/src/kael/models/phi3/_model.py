"""``Phi3ForCausalLM``: the Llama family's forward pass over Phi-3's fused projections and partial rotary.

Parameters are the checkpoint's keys: per layer ``self_attn.qkv_proj.weight`` [(H + 2 Hkv) * D, C] (the q
rows, then k's, then v's), ``self_attn.o_proj.weight`` [C, H * D], ``mlp.gate_up_proj.weight`` [2F, C]
(gate's rows, then up's), ``mlp.down_proj.weight`` [C, F], the two RMSNorms, and ``model.embed_tokens``,
``model.norm``, ``lm_head`` (absent when tied). No biases. One layer, for x [B, T, C]:

    h = rms_norm(x, input_layernorm);  qkv = qkv_proj(h) as [B, T, H + 2 Hkv, D]
    q, k, v = heads [0, H), [H, H + Hkv), [H + Hkv, H + 2 Hkv) of qkv       (views, as [B, H(kv), T, D])
    q, k = rope on their first R = rotary_dim dims, the other D - R dims as they are (partial rotary)
    x = x + o_proj(attention(q, k, v, causal))
    gu = gate_up_proj(rms_norm(x, post_attention_layernorm));  x = x + down_proj(silu_mul(gu[:F], gu[F:]))

The rotary tables and the positions that index them are ``_rope.py``'s (NOTE [longrope factors]). Since q/k/v
and gate/up are one weight each, ``kael.quantize`` quantizes each as one QuantizedLinear and the direct step
(``Phi3DecodeStep``) runs them as the Llama step runs its fused buffers; nothing needs re-fusing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ... import _dtype as dt
from ..._tensor import Tensor
from ...nn import Module
from ...ops import cat, narrow, rope, silu_mul, transpose, view
from .._paged_cache import PagedKVCache
from .._protocol import DecodeStep
from ..llama import LlamaForCausalLM
from ..llama._model import LlamaDecoderLayer, LlamaModel, Projection, attend_and_project
from ._config import Phi3Config, phi3_hf_config, read_config
from ._rope import rope_tables, table_offset

__all__ = ["Phi3ForCausalLM", "Phi3Attention", "Phi3MLP", "Phi3DecoderLayer", "Phi3Model"]


def _rotate(x: Tensor, rot: int, cos: Tensor, sin: Tensor, pos: Tensor) -> Tensor:
    """rope on the first ``rot`` dims of x [B, H, T, D], the rest passed through."""
    d = x.shape[-1]
    if rot == d:
        out: Tensor = rope(x, cos, sin, pos)
        return out
    return cat([rope(narrow(x, 3, 0, rot), cos, sin, pos), narrow(x, 3, rot, d - rot)], 3)


class Phi3Attention(Module):
    """Grouped-query attention with one q/k/v projection ``qkv_proj`` and ``o_proj``; rotary on ``rotary_dim`` dims."""

    def __init__(self, config: Phi3Config, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        c, h, kv, d = config.hidden_size, config.num_attention_heads, config.kv_heads, config.dim
        self.heads, self.kv_heads, self.head_dim, self.rotary_dim = h, kv, d, config.rotary_dim
        self.qkv_proj = Projection(c, (h + 2 * kv) * d, False, device, dtype)
        self.o_proj = Projection(h * d, c, False, device, dtype)
        self.scale: float | None = None  # the softmax scale (None: 1/sqrt(D)), as LlamaAttention's
        self.window: int | None = config.layer_windows[0] if config.layer_windows else None  # sliding_window

    def forward(self, x: Tensor, rot: tuple[Tensor, Tensor, Tensor], step: Any = None, layer: int = 0) -> Tensor:
        """x [B, T, C] -> [B, T, C]; rot = (cos, sin, table positions [B, T]); ``step`` the cache step or None."""
        b, t, _ = x.shape
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        cos, sin, pos = rot
        qkv = view(self.qkv_proj(x), b, t, h + 2 * kv, d)
        q = transpose(narrow(qkv, 2, 0, h), 1, 2)  # [B, H, T, D]
        k = transpose(narrow(qkv, 2, h, kv), 1, 2)  # [B, Hkv, T, D]
        v = transpose(narrow(qkv, 2, h + kv, kv), 1, 2)
        q, k = _rotate(q, self.rotary_dim, cos, sin, pos), _rotate(k, self.rotary_dim, cos, sin, pos)
        return attend_and_project(self, q, k, v, step, layer)


class Phi3MLP(Module):
    """SwiGLU over one gate/up projection: ``down_proj(silu(g) * u)`` with ``[g, u] = gate_up_proj(x)``."""

    def __init__(self, config: Phi3Config, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        c, f = config.hidden_size, config.intermediate_size
        self.intermediate = f
        self.gate_up_proj = Projection(c, 2 * f, False, device, dtype)
        self.down_proj = Projection(f, c, False, device, dtype)

    def forward(self, x: Tensor) -> Tensor:
        f = self.intermediate
        gu = self.gate_up_proj(x)
        out: Tensor = self.down_proj(silu_mul(narrow(gu, -1, 0, f), narrow(gu, -1, f, f)))
        return out


class Phi3DecoderLayer(LlamaDecoderLayer):
    """One layer: pre-norm attention and MLP (Phi-3's fused projections), each added to the residual stream."""

    attention_class = Phi3Attention
    mlp_class = Phi3MLP


class Phi3Model(LlamaModel):
    """The decoder stack without the head: ``embed_tokens``, ``layers``, ``norm`` (checkpoint prefix ``model.``)."""

    layer_class = Phi3DecoderLayer


class Phi3ForCausalLM(LlamaForCausalLM):
    """A Phi-3 causal LM (``forward(ids [B, T], cache=None) -> logits [B, T, V]``); loads phi3 checkpoints."""

    config: Phi3Config
    config_class = Phi3Config
    model_class = Phi3Model
    #: rope_tables' cos and sin: [P, rotary_dim / 2], or with longrope [2P, rotary_dim / 2] (NOTE [longrope factors]).
    rope_values = staticmethod(rope_tables)

    @staticmethod
    def read_config(path: Any) -> Phi3Config:
        """The Phi3Config of a phi3 ``config.json``."""
        return read_config(path)

    def hf_config(self) -> dict[str, Any]:
        """The phi3 ``config.json`` dictionary ``save_pretrained`` writes."""
        return phi3_hf_config(self.config, self.dtype.name)

    def table_starts(self, starts: Sequence[int], tokens: int) -> list[int]:
        """Each row's first table row for a pass of ``tokens`` from ``starts`` (its position, plus P when the
        long factors apply: NOTE [longrope factors])."""
        return [s + table_offset(self.config, s, tokens) for s in starts]

    def run_layer(self, i: int, x: Tensor, step: Any) -> Tensor:
        """Layer ``i`` on x [B, T, C]; its attention reads and extends ``step``'s cache (None: no cache)."""
        t = x.shape[1]
        starts = step.starts if step is not None else [0] * x.shape[0]
        cos, sin = self.rope_tables()
        out: Tensor = self.model.layers[i](x, (cos, sin, self._positions(self.table_starts(starts, t), t)), step, i)
        return out

    def on_quantized(self) -> None:
        """Nothing to re-fuse: q/k/v and gate/up are one weight each (a QuantizedLinear each when quantized)."""

    def decode_step(self, cache: PagedKVCache) -> DecodeStep | None:
        """``Phi3DecodeStep`` (None on a backend without its kernels: the generic step then runs this model's forward)."""
        from ._step import Phi3DecodeStep

        return Phi3DecodeStep.create(self, cache)
