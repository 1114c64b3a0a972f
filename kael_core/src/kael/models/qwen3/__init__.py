"""The Qwen3 family (dense; ``model_type`` ``"qwen3"``, GGUF architecture ``"qwen3"``), built on the Llama family.

Qwen3 is Llama with each query and key head RMS-normalised before rope (``q_norm``,
``k_norm``), an explicit ``head_dim`` and optional q/k/v/o biases (``attention_bias``):
``Qwen3Config`` is a ``LlamaConfig`` with ``qk_norm`` on, ``Qwen3ForCausalLM`` a
``LlamaForCausalLM`` that reads and writes qwen3 ``config.json`` files. ``FAMILIES`` is what
the family registry (``kael.models.families``) serves for ``"qwen3"``.
"""

from __future__ import annotations

from .._registry import ModelFamily
from ._config import MODEL_TYPE, Qwen3Config, qwen3_hf_config, read_config
from ._model import Qwen3ForCausalLM

__all__ = ["Qwen3ForCausalLM", "Qwen3Config", "read_config", "qwen3_hf_config", "from_pretrained", "FAMILIES"]


from_pretrained = Qwen3ForCausalLM.from_pretrained
"""A Qwen3ForCausalLM from a Hugging Face qwen3 checkpoint directory, in eval mode (the Llama loader's
arguments: ``kael.models.llama.from_pretrained``)."""


FAMILIES = (
    ModelFamily(
        MODEL_TYPE,
        from_pretrained,
        description="Qwen3 (Hugging Face Qwen3ForCausalLM checkpoints: Llama with per-head q/k RMSNorm before rope)",
        gguf_architectures=("qwen3",),
    ),
)
