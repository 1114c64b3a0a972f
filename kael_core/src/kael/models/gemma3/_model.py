"""``GemmaForCausalLM`` (Gemma 2 and 3's model) and ``Gemma3ForCausalLM``, on the Llama family's model.

Parameters are named as Hugging Face's Gemma checkpoint keys: Llama's plus each layer's
``pre_feedforward_layernorm`` and ``post_feedforward_layernorm`` (and Gemma 3's ``self_attn.q_norm`` /
``k_norm`` [head_dim]). One forward pass, C = hidden_size, with ``norm(x) = rms_norm(x) * (1 + weight)``
(``gelu_tanh_mul`` and ``softcap`` are the catalogue's fused ops):

    x      = embed_tokens[ids] * sqrt(C)   (the factor rounded to the model's dtype, as transformers)  embed
    per layer i (rotary tables and window of layer_types[i]):
      h    = norm(x, input_layernorm)
      q, k = rope(q_norm(q_proj(h)), k_norm(k_proj(h)))   (per head; Gemma 2: no q/k norm), v = v_proj(h)
      x    = x + norm(o_proj(attend(q, k, v)), post_attention_layernorm)   (scale query_pre_attn_scalar^-0.5)
      x    = x + norm(down_proj(gelu_tanh_mul(gate_proj(h2), up_proj(h2))), post_feedforward_layernorm)
             with h2 = norm(x, pre_feedforward_layernorm)
    logits = embed_tokens^T norm(x, norm), then softcap(logits, final_logit_softcapping)               run_head

NOTE [gemma norm]: the checkpoint stores w and the norm multiplies by (1 + w), computed in float32 whatever
the model's dtype (transformers' ``Gemma3RMSNorm``: ``(x_norm * (1 + w.float())).type_as(x)``); kael's
``rms_norm`` gets the float32 weight ``1 + w`` and, for a half model, float32 activations. The attention
(sliding windows, soft-capping) is ``_attention.py``'s. There is no direct decode step (``decode_step``
returns None: ``GenericStep`` runs these pieces).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ... import _dtype as dt
from ..._tensor import Tensor
from ...nn import Module, ModuleList, Parameter
from ...ops import (
    add,
    cat,
    empty,
    gelu_tanh_mul,
    mul,
    narrow,
    reshape,
    rms_norm,
    rope,
    softcap,
    tensor,
    to,
    transpose,
    unsqueeze,
    view,
)
from .._paged_cache import PagedKVCache
from .._protocol import DecodeStep
from .._registry import model_type_of
from ..llama import CheckpointLayout, LlamaConfig, LlamaForCausalLM
from ..llama._model import Projection, Table
from ..llama._rope import rope_tables
from ._attention import attend, cached_keys
from ._config import Gemma3Config, GemmaConfig, gemma3_hf_config, read_config

__all__ = ["GemmaForCausalLM", "Gemma3ForCausalLM", "GemmaRMSNorm", "GemmaAttention", "GemmaMLP", "GemmaDecoderLayer"]

_WIDE = (dt.float32, dt.float64)


class GemmaRMSNorm(Module):
    """``rms_norm(x) * (1 + weight)`` over the last dim (NOTE [gemma norm]); ``weight`` [dim] as stored."""

    def __init__(self, dim: int, eps: float, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        self.eps = eps
        self.weight = Parameter(empty((dim,), dtype=dtype, device=device))

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight if self.weight.dtype in _WIDE else to(self.weight, dtype=dt.float32)
        scale = add(w, 1.0)
        if x.dtype in _WIDE:
            return rms_norm(x, scale if scale.dtype is x.dtype else to(scale, dtype=x.dtype), self.eps)
        return to(rms_norm(to(x, dtype=dt.float32), scale, self.eps), dtype=x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, offset=1"


class GemmaAttention(Module):
    """Grouped-query attention with Gemma's scale, window (sliding layers) and soft-capping (Gemma 2)."""

    def __init__(self, config: GemmaConfig, layer: int, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        c, h, kv, d = config.hidden_size, config.num_attention_heads, config.kv_heads, config.dim
        self.heads, self.kv_heads, self.head_dim = h, kv, d
        self.q_proj = Projection(c, h * d, config.qkv_bias, device, dtype)
        self.k_proj = Projection(c, kv * d, config.qkv_bias, device, dtype)
        self.v_proj = Projection(c, kv * d, config.qkv_bias, device, dtype)
        self.o_proj = Projection(h * d, c, config.o_bias, device, dtype)
        self.qk_norm = config.qk_norm
        if config.qk_norm:
            self.q_norm = GemmaRMSNorm(d, config.rms_norm_eps, device, dtype)
            self.k_norm = GemmaRMSNorm(d, config.rms_norm_eps, device, dtype)
        self.scale = config.scale
        self.window: int | None = config.sliding_window if config.sliding(layer) else None
        self.softcap = config.attn_logit_softcapping

    def extra_repr(self) -> str:
        return f"heads={self.heads}, kv_heads={self.kv_heads}, window={self.window}, softcap={self.softcap}"

    def forward(self, x: Tensor, rot: tuple[Tensor, Tensor, Tensor], step: Any = None, layer: int = 0) -> Tensor:
        """x [B, T, C] -> [B, T, C]; rot = (cos, sin, positions [B, T]); ``step`` the cache step or None."""
        b, t, _ = x.shape
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        cos, sin, pos = rot
        q, k = view(self.q_proj(x), b, t, h, d), view(self.k_proj(x), b, t, kv, d)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = rope(transpose(q, 1, 2), cos, sin, pos)  # [B, H, T, D]
        k = rope(transpose(k, 1, 2), cos, sin, pos)  # [B, Hkv, T, D]
        v = transpose(view(self.v_proj(x), b, t, kv, d), 1, 2)
        if step is None:
            y = attend(q, k, v, self.scale, self.window, self.softcap)
        elif self.softcap is None:  # the cache step attends at 1/sqrt(D): scale q
            w = {} if self.window is None else {"window": self.window}
            kv_new = cat([unsqueeze(k, 1), unsqueeze(v, 1)], 1)
            y = step.attend(layer, mul(q, self.scale * math.sqrt(d)), kv_new, **w)
        else:  # Gemma 2's soft-capped scores: the decomposition over each row's cached keys
            rows = cached_keys(step, layer, k, v)
            outs = [
                attend(narrow(q, 0, i, 1), kr, vr, self.scale, self.window, self.softcap)
                for i, (kr, vr) in enumerate(rows)
            ]
            y = outs[0] if len(outs) == 1 else cat(outs, 0)
        out: Tensor = self.o_proj(reshape(transpose(y, 1, 2), b, t, h * d))
        return out


class GemmaMLP(Module):
    """GeGLU: ``down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, config: LlamaConfig, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        c, f = config.hidden_size, config.intermediate_size
        self.gate_proj = Projection(c, f, False, device, dtype)
        self.up_proj = Projection(c, f, False, device, dtype)
        self.down_proj = Projection(f, c, False, device, dtype)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down_proj(gelu_tanh_mul(self.gate_proj(x), self.up_proj(x)))
        return out


class GemmaDecoderLayer(Module):
    """One layer: attention and MLP, each normed before and after, each added to the residual stream."""

    def __init__(self, config: GemmaConfig, layer: int, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        c, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = GemmaAttention(config, layer, device, dtype)
        self.mlp = GemmaMLP(config, device, dtype)
        self.input_layernorm = GemmaRMSNorm(c, eps, device, dtype)
        self.post_attention_layernorm = GemmaRMSNorm(c, eps, device, dtype)
        self.pre_feedforward_layernorm = GemmaRMSNorm(c, eps, device, dtype)
        self.post_feedforward_layernorm = GemmaRMSNorm(c, eps, device, dtype)

    def forward(self, x: Tensor, rot: tuple[Tensor, Tensor, Tensor], step: Any = None, layer: int = 0) -> Tensor:
        x = add(x, self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rot, step, layer)))
        out: Tensor = add(x, self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x))))
        return out


class GemmaModel(Module):
    """The decoder stack without the head: ``embed_tokens``, ``layers``, ``norm`` (checkpoint prefix ``model.``)."""

    def __init__(self, config: GemmaConfig, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        self.embed_tokens: Module = Table(config.vocab_size, config.hidden_size, device, dtype)
        self.layers = ModuleList([GemmaDecoderLayer(config, i, device, dtype) for i in range(config.num_hidden_layers)])
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)


class GemmaForCausalLM(LlamaForCausalLM):
    """A Gemma 2 / 3 causal LM: ``forward(ids [B, T], cache=None) -> logits [B, T, V]`` (a family's base:
    ``Gemma3ForCausalLM``, ``kael.models.gemma2.Gemma2ForCausalLM``).

    ``cls(config)`` draws transformers' initialisation (N(0, initializer_range) weights, zero norm weights:
    unit scales); ``cls.from_pretrained(directory)`` loads a Hugging Face checkpoint (the Llama loader).
    """

    config: GemmaConfig
    config_class = GemmaConfig
    model_class = GemmaModel

    def __init__(self, config: LlamaConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._normalizer: tuple[Any, Tensor] | None = None

    def reset_parameters(self, generator: Any = None, std: float = 0.02) -> None:
        """transformers' initialisation: N(0, std) projections and embeddings, zero biases and norm weights."""
        from ...nn import init

        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or name.endswith("bias"):
                init.zeros_(p)
            else:
                init.normal_(p, 0.0, std, generator=generator)

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"{super().extra_repr()}, sliding_window={c.sliding_window}, "
            f"full_layers={[i for i in range(c.num_hidden_layers) if not c.sliding(i)]}"
        )

    def rope_tables(self, layer_type: str = "full_attention") -> tuple[Tensor, Tensor]:
        """The cos and sin tables [max_positions, head_dim / 2] of ``layer_type``'s rotary settings."""
        dev = self.device
        wide = self.dtype is dt.float64
        key = (dev, f"{'float64' if wide else 'float32'}/{layer_type}")
        got = self._rot_tables.get(key)
        if got is None:
            import numpy as np

            cos, sin = rope_tables(
                self.config.rope_config(layer_type), self.max_positions, np.float64 if wide else np.float32
            )
            tdt = dt.float64 if wide else dt.float32
            got = (tensor(cos, dtype=tdt, device=dev), tensor(sin, dtype=tdt, device=dev))
            self._rot_tables[key] = got
        return got

    def embed(self, ids: Tensor, starts: Sequence[int]) -> Tensor:
        """The token embeddings times sqrt(hidden_size) rounded to the model's dtype [B, T, C]."""
        x: Tensor = self.model.embed_tokens(ids)
        key = (x.device, x.dtype)
        if self._normalizer is None or self._normalizer[0] != key:
            self._normalizer = (key, tensor(math.sqrt(self.config.hidden_size), dtype=x.dtype, device=x.device))
        out: Tensor = mul(x, self._normalizer[1])
        return out

    def run_layer(self, i: int, x: Tensor, step: Any) -> Tensor:
        """Layer ``i`` with its layer type's rotary tables; its attention reads and extends ``step``'s cache."""
        starts = step.starts if step is not None else [0] * x.shape[0]
        types = self.config.layer_types
        assert types is not None
        cos, sin = self.rope_tables(types[i])
        out: Tensor = self.model.layers[i](x, (cos, sin, self._positions(starts, x.shape[1])), step, i)
        return out

    def run_head(self, x: Tensor) -> Tensor:
        """The final norm, the LM head and ``final_logit_softcapping``: logits [B, T, V]."""
        logits = super().run_head(x)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else softcap(logits, cap)

    def quantization_plan(self, weights: str) -> dict[str, str | None]:
        """The Llama family's plan (llama.cpp's mix over the GGUF tensors), made with the config's values a GGUF
        file can hold (scale, layer pattern, sliding rope: none changes a tensor, and ``save_gguf`` refuses the
        others, NOTE in ``_gguf.py``)."""
        from ._gguf import gguf_expressible

        config = self.config
        self.config = gguf_expressible(config)
        try:
            return super().quantization_plan(weights)
        finally:
            self.config = config

    def decode_step(self, cache: PagedKVCache) -> DecodeStep | None:
        """None: ``LlamaDecodeStep`` has no window, soft-capping or Gemma norm, so ``GenericStep`` runs the
        forward pieces (correct first; a direct Gemma step is future work)."""
        return None


class Gemma3ForCausalLM(GemmaForCausalLM):
    """A Gemma 3 (text) causal LM: ``forward(ids [B, T], cache=None) -> logits [B, T, V]``.

    ``Gemma3ForCausalLM.from_pretrained(directory)`` loads a Hugging Face gemma3_text checkpoint
    (``Gemma3ForCausalLM``; safetensors, sharded or not, float32/bfloat16/float16), or the text model of a
    multimodal gemma3 one (``Gemma3ForConditionalGeneration``; its vision tower is not loaded).
    """

    config: Gemma3Config
    config_class = Gemma3Config

    @staticmethod
    def read_config(path: Any) -> Gemma3Config:
        """The Gemma3Config of a checkpoint's ``config.json`` (gemma3_text, or a multimodal gemma3's text model)."""
        return read_config(path)

    @staticmethod
    def checkpoint_layout(directory: Any) -> CheckpointLayout:
        """A gemma3_text checkpoint's tensors are under their own names; a multimodal gemma3 one's text model is
        under a prefix, beside a vision tower kael does not load (NOTE [gemma3 multimodal checkpoint])."""
        from ._multimodal import MULTIMODAL_MODEL_TYPE, multimodal_layout

        if model_type_of(directory) == MULTIMODAL_MODEL_TYPE:
            return multimodal_layout(directory)
        return CheckpointLayout()

    def hf_config(self) -> dict[str, Any]:
        """The gemma3_text ``config.json`` dictionary ``save_pretrained`` writes."""
        return gemma3_hf_config(self.config, self.dtype.name)
