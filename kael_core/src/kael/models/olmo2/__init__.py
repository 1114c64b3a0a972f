"""The OLMo 2 family (``model_type`` ``"olmo2"``, GGUF architecture ``"olmo2"``), built on the Llama family.

OLMo 2 is Llama with the norms moved: none before attention or the MLP, an RMSNorm on each one's
output before its residual add (``post_attention_layernorm``, ``post_feedforward_layernorm``), and
q and k RMS-normalised over the whole projection (``q_norm`` [H*D], ``k_norm`` [Hkv*D]) before the
head split and rope. ``Olmo2Config`` is a ``LlamaConfig`` with transformers' OLMo 2 defaults,
``Olmo2ForCausalLM`` a ``LlamaForCausalLM`` whose layers are ``Olmo2DecoderLayer``s, and
``Olmo2DecodeStep`` the direct decode step in that order. ``FAMILIES`` is what the family registry
(``kael.models.families``) serves for ``"olmo2"``.
"""

from __future__ import annotations

from .._registry import ModelFamily
from ._config import MODEL_TYPE, Olmo2Config, olmo2_hf_config, read_config
from ._model import Olmo2Attention, Olmo2DecoderLayer, Olmo2ForCausalLM, Olmo2RMSNorm
from ._step import Olmo2DecodeStep

__all__ = [
    "Olmo2ForCausalLM",
    "Olmo2Config",
    "Olmo2Attention",
    "Olmo2DecoderLayer",
    "Olmo2RMSNorm",
    "Olmo2DecodeStep",
    "read_config",
    "olmo2_hf_config",
    "from_pretrained",
    "FAMILIES",
]


from_pretrained = Olmo2ForCausalLM.from_pretrained
"""An Olmo2ForCausalLM from a Hugging Face olmo2 checkpoint directory, in eval mode (the Llama loader's
arguments: ``kael.models.llama.from_pretrained``)."""


FAMILIES = (
    ModelFamily(
        MODEL_TYPE,
        from_pretrained,
        description=(
            "OLMo 2 (Hugging Face Olmo2ForCausalLM checkpoints: Llama with post-norms after attention and MLP "
            "and q/k RMSNorm over the whole projection)"
        ),
        gguf_architectures=("olmo2",),
    ),
)
