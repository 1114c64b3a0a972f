"""``GraniteForCausalLM``: the Llama family's model with Granite's four multipliers.

Parameters are named as Hugging Face's Granite checkpoint keys (Llama's). The forward pieces
(NOTE [model-family seam]) are Llama's with the config's scalars applied where transformers'
``GraniteForCausalLM`` applies them:

    x      = embed_tokens[ids] * embedding_multiplier                               embed
    x      = x + attn(rms_norm(x)) * residual_multiplier   (softmax scale: attention_multiplier)
    x      = x + mlp(rms_norm(x)) * residual_multiplier                             run_layer
    logits = lm_head(rms_norm(x)) / logits_scaling                                  run_head

The softmax scale is ``LlamaAttention.scale``; the direct decode step is ``GraniteDecodeStep``
(``_step.py``), so ``generate``, the batched decoder, the paged cache, quantization and GGUF
(``_gguf_llama.py``, architecture ``granite``) are the Llama family's.
"""

from __future__ import annotations

from typing import Any

from ..._tensor import Tensor
from ...ops import add, div, mul
from .._paged_cache import PagedKVCache
from .._protocol import DecodeStep
from ..llama import LlamaConfig, LlamaForCausalLM
from ._config import GraniteConfig, granite_hf_config, read_config

__all__ = ["GraniteForCausalLM"]


class GraniteForCausalLM(LlamaForCausalLM):
    """A Granite causal LM: ``forward(ids [B, T], cache=None) -> logits [B, T, V]``.

    ``GraniteForCausalLM(config)`` draws transformers' initialisation; ``from_pretrained(directory)``
    loads a Hugging Face granite checkpoint (safetensors, sharded or not, float32/bfloat16/float16).
    """

    config: GraniteConfig
    config_class = GraniteConfig

    def __init__(self, config: LlamaConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        for layer in self.model.layers:
            layer.self_attn.scale = float(self.config.attention_multiplier)

    @staticmethod
    def read_config(path: Any) -> GraniteConfig:
        """The GraniteConfig of a checkpoint's ``config.json``."""
        return read_config(path)

    def hf_config(self) -> dict[str, Any]:
        """The granite ``config.json`` dictionary ``save_pretrained`` writes."""
        return granite_hf_config(self.config, self.dtype.name)

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"{super().extra_repr()}, embedding_multiplier={c.embedding_multiplier}, "
            f"residual_multiplier={c.residual_multiplier}, attention_multiplier={c.attention_multiplier}, "
            f"logits_scaling={c.logits_scaling}"
        )

    def embed(self, ids: Tensor, starts: Any) -> Tensor:
        """The token embeddings times ``embedding_multiplier`` [B, T, C]."""
        out: Tensor = mul(super().embed(ids, starts), float(self.config.embedding_multiplier))
        return out

    def run_layer(self, i: int, x: Tensor, step: Any) -> Tensor:
        """Layer ``i``: each of attention and MLP times ``residual_multiplier`` before its residual add."""
        starts = step.starts if step is not None else [0] * x.shape[0]
        cos, sin = self.rope_tables()
        rot = (cos, sin, self._positions(starts, x.shape[1]))
        layer, r = self.model.layers[i], float(self.config.residual_multiplier)
        x = add(x, mul(layer.self_attn(layer.input_layernorm(x), rot, step, i), r))
        out: Tensor = add(x, mul(layer.mlp(layer.post_attention_layernorm(x)), r))
        return out

    def run_head(self, x: Tensor) -> Tensor:
        """The Llama head's logits divided by ``logits_scaling``."""
        out: Tensor = div(super().run_head(x), float(self.config.logits_scaling))
        return out

    def decode_step(self, cache: PagedKVCache) -> DecodeStep | None:
        """The direct-kernel step with the multipliers (``GraniteDecodeStep``), or None without the kernels."""
        from ._step import GraniteDecodeStep

        return GraniteDecodeStep.create(self, cache)
