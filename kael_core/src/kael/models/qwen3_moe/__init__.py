"""The Qwen3 mixture-of-experts family (``model_type`` ``"qwen3_moe"``), built on the Qwen3 family.

Qwen3-MoE is Qwen3 (Llama with per-head q/k RMSNorm before rope) whose MLP is, on the layers
``decoder_sparse_step`` and ``mlp_only_layers`` pick, a sparse mixture of experts: a router
``mlp.gate`` [E, C] sends each token to its top ``num_experts_per_tok`` experts (softmax in
float32, optionally renormalised: ``norm_topk_prob``), each a SwiGLU MLP of
``moe_intermediate_size``, and sums their outputs with the routing weights. It runs on the
fused ops ``kael.moe_route`` and ``kael.expert_linear`` (NOTE [expert grouping] in
``kael/ops/_moe_fused.py``). ``Qwen3MoeConfig`` is a ``LlamaConfig`` with the MoE fields,
``Qwen3MoeForCausalLM`` a ``LlamaForCausalLM`` whose sparse layers hold a
``Qwen3MoeSparseMoeBlock``. ``FAMILIES`` is what the family registry (``kael.models.families``)
serves for ``"qwen3_moe"``. GGUF files of llama.cpp's ``qwen3moe`` architecture load
(``kael/models/_gguf_qwen3moe.py``; kael writes none yet). ``Qwen3MoeDecodeStep`` is its direct-kernel
decode step (Qwen3's attention, the experts' ``moe_route`` / ``expert_linear`` kernels; float stacked experts).
"""

from __future__ import annotations

from .._registry import ModelFamily
from ._config import MODEL_TYPE, Qwen3MoeConfig, qwen3_moe_hf_config, read_config
from ._model import Qwen3MoeForCausalLM, Qwen3MoeRouter, Qwen3MoeSparseMoeBlock
from ._step import Qwen3MoeDecodeStep

__all__ = [
    "Qwen3MoeForCausalLM",
    "Qwen3MoeConfig",
    "Qwen3MoeSparseMoeBlock",
    "Qwen3MoeRouter",
    "Qwen3MoeDecodeStep",
    "read_config",
    "qwen3_moe_hf_config",
    "from_pretrained",
    "FAMILIES",
]


from_pretrained = Qwen3MoeForCausalLM.from_pretrained
"""A Qwen3MoeForCausalLM from a Hugging Face qwen3_moe checkpoint directory, in eval mode (the Llama loader's
arguments: ``kael.models.llama.from_pretrained``)."""


FAMILIES = (
    ModelFamily(
        MODEL_TYPE,
        from_pretrained,
        description=(
            "Qwen3-MoE (Hugging Face Qwen3MoeForCausalLM checkpoints: Qwen3 with sparse top-k mixture-of-experts MLPs)"
        ),
        gguf_architectures=("qwen3moe",),
    ),
)
