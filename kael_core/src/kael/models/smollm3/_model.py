"""``SmolLM3ForCausalLM``: the Llama family's model with rotary embeddings off on the ``no_rope_layers``.

Parameters are named as Hugging Face's SmolLM3 checkpoint keys (Llama's). Each layer's
``LlamaAttention.rope`` is its ``no_rope_layers`` flag: a layer with 0 attends with q and k as
projected (no rotation), as transformers' ``SmolLM3Attention`` with ``use_rope`` false does, and
``LlamaDecodeStep`` reads the same flags (it copies q and k where it would rotate them), so
``forward``, ``generate``, the batched decoder, the paged cache, quantization and GGUF
(``_gguf_llama.py``, architecture ``smollm3``) are the Llama family's; this class only sets the
flags and reads and writes SmolLM3's ``config.json``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..llama import LlamaConfig, LlamaForCausalLM
from ._config import SmolLM3Config, read_config, smollm3_hf_config

__all__ = ["SmolLM3ForCausalLM"]


class SmolLM3ForCausalLM(LlamaForCausalLM):
    """A SmolLM3 causal LM: ``forward(ids [B, T], cache=None) -> logits [B, T, V]``.

    ``SmolLM3ForCausalLM(config)`` draws transformers' initialisation; ``from_pretrained(directory)``
    loads a Hugging Face smollm3 checkpoint (safetensors, sharded or not, float32/bfloat16/float16).
    """

    config: SmolLM3Config
    config_class = SmolLM3Config

    def __init__(self, config: LlamaConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        for layer, rope in zip(self.model.layers, self.config.rope_layers):
            layer.self_attn.rope = rope

    @staticmethod
    def read_config(path: Any) -> SmolLM3Config:
        """The SmolLM3Config of a checkpoint's ``config.json``."""
        return read_config(path)

    def hf_config(self) -> dict[str, Any]:
        """The smollm3 ``config.json`` dictionary ``save_pretrained`` writes."""
        return smollm3_hf_config(self.config, self.dtype.name)

    def quantization_plan(self, weights: str) -> dict[str, str | None]:
        """The Llama family's plan (llama.cpp's mix over the GGUF tensors), with transformers' default no-rope
        pattern in the config while it is made: the pattern changes no tensor, and a GGUF file holds only that
        pattern (``save_gguf`` refuses another, NOTE in ``_gguf_llama.py``)."""
        config = self.config
        self.config = dataclasses.replace(config, no_rope_layers=None)
        try:
            return super().quantization_plan(weights)
        finally:
            self.config = config

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, no_rope_layers={list(self.config.no_rope_layers or ())}"
