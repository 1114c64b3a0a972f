"""``Olmo2ForCausalLM``: the Llama family's model with OLMo 2's post-norm layers and whole-projection q/k norms.

Parameters are named as Hugging Face's OLMo 2 checkpoint keys: Llama's projections, embeddings and
final ``model.norm``, and per layer ``post_attention_layernorm`` and ``post_feedforward_layernorm``
[C] (no ``input_layernorm``) and ``self_attn.q_norm`` [H*D] and ``k_norm`` [Hkv*D]. One layer, as
transformers' ``Olmo2DecoderLayer`` computes it (C hidden, H heads, Hkv key/value heads, D head dim):

    q = rms_norm(q_proj(x), q_norm)  [B, T, H*D]    k = rms_norm(k_proj(x), k_norm)  [B, T, Hkv*D]
        then split into heads and rotated (rope, transformers' rotate-half layout), v = v_proj(x)
    x = x + rms_norm(o_proj(attention(q, k, v)), post_attention_layernorm)
    x = x + rms_norm(down_proj(silu(gate_proj(x)) * up_proj(x)), post_feedforward_layernorm)

NOTE [whole-projection q/k norm]: the q and k norms' statistics are over all heads of a token's
projection (mean of squares over H*D values), not per head as Qwen3's (``LlamaConfig.qk_norm``,
off here): normalising then splitting is not splitting then normalising.

NOTE [olmo2 norm rounding]: transformers' ``Olmo2RMSNorm`` multiplies the float32 normalised value by
the weight and rounds once, to the input's dtype; Llama's (kael's ``rms_norm``) rounds the normalised
value first, then multiplies in the input's dtype. The two agree in float32 and float64; for a half
dtype (``dtype="auto"`` on a bfloat16 checkpoint) ``Olmo2RMSNorm`` runs the norm on float32 copies of
x and the weight and rounds the result once, as transformers does (the direct step then gives way to
the generic one: ``Olmo2ForCausalLM.decode_step``).

The embedding, rotary tables, positions, cache attention and head are Llama's (NOTE [model-family
seam]): ``LlamaForCausalLM.run_layer`` calls each layer module, which here is an ``Olmo2DecoderLayer``.
The direct decode step is ``Olmo2DecodeStep`` (``_step.py``); quantization and GGUF
(``_gguf_llama.py``, architecture ``olmo2``) are the Llama family's with OLMo 2's tensors.
"""

from __future__ import annotations

from typing import Any

from ... import _dtype as dt
from ..._tensor import Tensor
from ...nn import Module, RMSNorm
from ...nn import functional as F
from ...ops import add, rope, to, transpose, view
from .._paged_cache import PagedKVCache
from .._protocol import DecodeStep
from ..llama import LlamaAttention, LlamaConfig, LlamaForCausalLM, LlamaMLP, LlamaModel
from ..llama._model import attend_and_project
from ._config import Olmo2Config, olmo2_hf_config, read_config

__all__ = ["Olmo2ForCausalLM", "Olmo2Attention", "Olmo2DecoderLayer", "Olmo2RMSNorm"]

_WIDE = (dt.float32, dt.float64)


class Olmo2RMSNorm(RMSNorm):
    """``RMSNorm`` over the last dim that, for a half-precision x, rounds once after the weight (NOTE [olmo2 norm
    rounding]): ``(weight * x / sqrt(mean(x**2) + eps))`` in float32, then x's dtype."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype in _WIDE:
            return super().forward(x)
        w = None if self.weight is None else to(self.weight, dtype=dt.float32)
        half: Tensor = to(F.rms_norm(to(x, dtype=dt.float32), self.normalized_shape, w, self.eps), dtype=x.dtype)
        return half


class Olmo2Attention(LlamaAttention):
    """``LlamaAttention`` with q and k RMS-normalised over the whole projection (``q_norm`` [H*D],
    ``k_norm`` [Hkv*D]) before the head split and rope (NOTE [whole-projection q/k norm])."""

    def __init__(self, config: LlamaConfig, device: Any, dtype: dt.DType) -> None:
        super().__init__(config, device, dtype)
        h, kv, d, eps = self.heads, self.kv_heads, self.head_dim, config.rms_norm_eps
        self.q_norm = Olmo2RMSNorm(h * d, eps=eps, device=device, dtype=dtype)
        self.k_norm = Olmo2RMSNorm(kv * d, eps=eps, device=device, dtype=dtype)

    def forward(self, x: Tensor, rot: tuple[Tensor, Tensor, Tensor], step: Any = None, layer: int = 0) -> Tensor:
        """x [B, T, C] -> [B, T, C]; rot = (cos, sin, positions [B, T]); ``step`` the cache step or None."""
        b, t, _ = x.shape
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        cos, sin, pos = rot
        q = view(self.q_norm(self.q_proj(x)), b, t, h, d)  # normalised over H*D, then [B, T, H, D]
        k = view(self.k_norm(self.k_proj(x)), b, t, kv, d)
        q = rope(transpose(q, 1, 2), cos, sin, pos)  # [B, H, T, D]
        k = rope(transpose(k, 1, 2), cos, sin, pos)  # [B, Hkv, T, D]
        v = transpose(view(self.v_proj(x), b, t, kv, d), 1, 2)
        return attend_and_project(self, q, k, v, step, layer)


class Olmo2DecoderLayer(Module):
    """One layer: attention and MLP on the residual stream as it is, each output RMS-normalised before its add."""

    def __init__(self, config: LlamaConfig, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        c, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Olmo2Attention(config, device, dtype)
        self.mlp = LlamaMLP(config, device, dtype)
        self.post_attention_layernorm = Olmo2RMSNorm(c, eps=eps, device=device, dtype=dtype)
        self.post_feedforward_layernorm = Olmo2RMSNorm(c, eps=eps, device=device, dtype=dtype)

    def forward(self, x: Tensor, rot: tuple[Tensor, Tensor, Tensor], step: Any = None, layer: int = 0) -> Tensor:
        x = add(x, self.post_attention_layernorm(self.self_attn(x, rot, step, layer)))
        out: Tensor = add(x, self.post_feedforward_layernorm(self.mlp(x)))
        return out


class Olmo2Model(LlamaModel):
    """The decoder stack without the head: ``embed_tokens``, ``layers`` (``Olmo2DecoderLayer``), ``norm``
    (``Olmo2RMSNorm``; checkpoint prefix ``model.``)."""

    layer_class = Olmo2DecoderLayer
    norm_class = Olmo2RMSNorm


class Olmo2ForCausalLM(LlamaForCausalLM):
    """An OLMo 2 causal LM: ``forward(ids [B, T], cache=None) -> logits [B, T, V]``.

    ``Olmo2ForCausalLM(config)`` draws transformers' initialisation (unit norms, q_norm and k_norm
    included); ``from_pretrained(directory)`` loads a Hugging Face olmo2 checkpoint (safetensors,
    sharded or not, float32/bfloat16/float16).
    """

    config: Olmo2Config
    config_class = Olmo2Config
    model_class = Olmo2Model

    @staticmethod
    def read_config(path: Any) -> Olmo2Config:
        """The Olmo2Config of a checkpoint's ``config.json``."""
        return read_config(path)

    def hf_config(self) -> dict[str, Any]:
        """The olmo2 ``config.json`` dictionary ``save_pretrained`` writes."""
        return olmo2_hf_config(self.config, self.dtype.name)

    def decode_step(self, cache: PagedKVCache) -> DecodeStep | None:
        """The direct-kernel step with post-norms and whole-projection q/k norms (``Olmo2DecodeStep``), or None
        when the backend lacks a kernel it calls or the model computes in a half dtype (NOTE [olmo2 norm rounding]):
        then the generic step runs this model's forward."""
        from ._step import Olmo2DecodeStep

        if self.dtype not in _WIDE:
            return None
        return Olmo2DecodeStep.create(self, cache)
