"""``Gemma2ForCausalLM``: Gemma's model (``kael.models.gemma3.GemmaForCausalLM``) with a Gemma 2 config.

Parameters are named as Hugging Face's Gemma 2 checkpoint keys (Gemma 3's without ``q_norm`` / ``k_norm``).
Every layer attends with the soft-capped scores (``attn_logit_softcapping``), so the attention is the masked
decomposition of ``kael/models/gemma3/_attention.py`` on every layer (NOTE [gemma attention paths]): a fused
attention op with a soft-cap (and window) parameter would serve both.
"""

from __future__ import annotations

from typing import Any

from ..gemma3 import GemmaForCausalLM
from ._config import Gemma2Config, gemma2_hf_config, read_config

__all__ = ["Gemma2ForCausalLM"]


class Gemma2ForCausalLM(GemmaForCausalLM):
    """A Gemma 2 causal LM: ``forward(ids [B, T], cache=None) -> logits [B, T, V]``.

    ``Gemma2ForCausalLM.from_pretrained(directory)`` loads a Hugging Face gemma2 checkpoint (safetensors,
    sharded or not, float32/bfloat16/float16).
    """

    config: Gemma2Config
    config_class = Gemma2Config

    @staticmethod
    def read_config(path: Any) -> Gemma2Config:
        """The Gemma2Config of a checkpoint's ``config.json``."""
        return read_config(path)

    def hf_config(self) -> dict[str, Any]:
        """The gemma2 ``config.json`` dictionary ``save_pretrained`` writes."""
        return gemma2_hf_config(self.config, self.dtype.name)
