"""``Qwen3ForCausalLM``: the Llama family's model with per-head q/k norms (``qk_norm``).

Parameters are named as Hugging Face's Qwen3 checkpoint keys: Llama's
(``model.layers.N.self_attn.q_proj.weight``, ...) plus ``model.layers.N.self_attn.q_norm.weight``
and ``k_norm.weight`` [head_dim]. ``LlamaAttention`` applies the norms to q viewed as
[B, T, H, D] and k as [B, T, Hkv, D] before rope, and ``LlamaDecodeStep`` does the same with
the backend's ``rms_norm`` kernel, so ``forward``, ``generate``, the batched decoder, the paged
cache, quantization and GGUF (``_gguf_llama.py``, architecture ``qwen3``) are the Llama
family's; this class only reads and writes Qwen3's ``config.json``.
"""

from __future__ import annotations

from typing import Any

from ..llama import LlamaForCausalLM
from ._config import Qwen3Config, qwen3_hf_config, read_config

__all__ = ["Qwen3ForCausalLM"]


class Qwen3ForCausalLM(LlamaForCausalLM):
    """A Qwen3 causal LM: ``forward(ids [B, T], cache=None) -> logits [B, T, V]``.

    ``Qwen3ForCausalLM(config)`` draws transformers' initialisation (unit norms, q_norm and
    k_norm included); ``Qwen3ForCausalLM.from_pretrained(directory)`` loads a Hugging Face
    qwen3 checkpoint (safetensors, sharded or not, float32/bfloat16/float16).
    """

    config_class = Qwen3Config

    @staticmethod
    def read_config(path: Any) -> Qwen3Config:
        """The Qwen3Config of a checkpoint's ``config.json``."""
        return read_config(path)

    def hf_config(self) -> dict[str, Any]:
        """The qwen3 ``config.json`` dictionary ``save_pretrained`` writes."""
        return qwen3_hf_config(self.config, self.dtype.name)
