"""The Phi-3 family (``model_type`` ``"phi3"``: Phi-3, Phi-3.5-mini, Phi-4-mini; GGUF architecture ``"phi3"``),
built on the Llama family.

Phi-3 is Llama with q/k/v in one projection (``self_attn.qkv_proj``) and gate/up in one
(``mlp.gate_up_proj``), no biases, a partial rotary factor (Phi-4-mini rotates 3/4 of each head) and
longrope scaling (short and long per-frequency factors, an attention factor on cos and sin). ``Phi3Config``
is a ``LlamaConfig`` with them, ``Phi3ForCausalLM`` a ``LlamaForCausalLM`` over Phi-3's modules, and
``Phi3DecodeStep`` the Llama direct step over the fused weights. ``FAMILIES`` is what
the family registry (``kael.models.families``) serves for ``"phi3"``.
"""

from __future__ import annotations

from .._registry import ModelFamily
from ._config import MODEL_TYPE, LongRope, Phi3Config, phi3_hf_config, read_config
from ._model import Phi3ForCausalLM
from ._step import Phi3DecodeStep

__all__ = [
    "Phi3ForCausalLM",
    "Phi3Config",
    "LongRope",
    "Phi3DecodeStep",
    "read_config",
    "phi3_hf_config",
    "from_pretrained",
    "FAMILIES",
]


from_pretrained = Phi3ForCausalLM.from_pretrained
"""A Phi3ForCausalLM from a Hugging Face phi3 checkpoint directory, in eval mode (the Llama loader's
arguments: ``kael.models.llama.from_pretrained``)."""


FAMILIES = (
    ModelFamily(
        MODEL_TYPE,
        from_pretrained,
        description=(
            "Phi-3, Phi-3.5-mini and Phi-4-mini (Hugging Face Phi3ForCausalLM checkpoints: Llama with fused "
            "qkv/gate_up projections, partial rotary and longrope)"
        ),
        gguf_architectures=("phi3",),
    ),
)
