"""``Qwen3MoeConfig``: the shape of a Qwen3 mixture-of-experts model, and its Hugging Face ``config.json``.

Qwen3-MoE is the Qwen3 model (per-head q/k RMSNorm before rope, explicit ``head_dim``,
``attention_bias`` on q, k, v and o) whose MLP is, on most layers, a sparse mixture of experts
(transformers' ``Qwen3MoeSparseMoeBlock``):

    num_experts            E experts, each a SwiGLU MLP of ``moe_intermediate_size`` (transformers
                           writes the key ``num_local_experts``, the released configs ``num_experts``;
                           both are read)
    num_experts_per_tok    k experts per token (1 <= k <= E)
    norm_topk_prob         the k routing weights renormalised to sum 1
    decoder_sparse_step    layer i is sparse when (i + 1) % decoder_sparse_step == 0 ...
    mlp_only_layers        ... and i is not listed here (those layers keep a dense MLP of
                           ``intermediate_size``); E = 0 makes every layer dense

``read_config`` checks these, then reads the rest with the Llama reader
(``kael.models.llama.config_from_dict``), so every value kael cannot run is a FormatError
naming the file and the rule. The router's auxiliary loss (``router_aux_loss_coef``,
``output_router_logits``) is training-only and not read. Sliding windows: transformers applies
``sliding_window`` to every layer when ``use_sliding_window`` is true: every layer's
``layer_windows`` entry (``kael/models/llama/_windows.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from ..._errors import ShapeError
from ..llama import LlamaConfig, config_from_dict, hf_config
from ..llama._config import read_family_config
from ..llama._windows import family_layer_windows, window_fields

__all__ = ["Qwen3MoeConfig", "read_config", "qwen3_moe_hf_config", "MODEL_TYPE", "MOE_FIELDS"]

MODEL_TYPE = "qwen3_moe"
#: The fields a Qwen3-MoE config.json must give (no default fits an unknown checkpoint).
MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")


@dataclass(frozen=True)
class Qwen3MoeConfig(LlamaConfig):
    """A ``LlamaConfig`` of model type ``"qwen3_moe"``: q/k norms on, and the mixture-of-experts fields."""

    model_types: ClassVar[tuple[str, ...]] = (MODEL_TYPE,)

    model_type: str = MODEL_TYPE
    qk_norm: bool = True
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 768
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        e, k = self.num_experts, self.num_experts_per_tok
        if isinstance(e, bool) or not isinstance(e, int) or e < 0:
            raise ShapeError(f"Qwen3MoeConfig: num_experts must be an int >= 0, got {e!r}")
        if e and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= e):
            raise ShapeError(f"Qwen3MoeConfig: num_experts_per_tok must be an int in [1, num_experts={e}], got {k!r}")
        for name in ("moe_intermediate_size", "decoder_sparse_step"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ShapeError(f"Qwen3MoeConfig: {name} must be a positive int, got {v!r}")
        if not isinstance(self.norm_topk_prob, bool):
            raise ShapeError(f"Qwen3MoeConfig: norm_topk_prob must be a bool, got {self.norm_topk_prob!r}")
        layers = self.mlp_only_layers
        if not isinstance(layers, tuple) or any(isinstance(i, bool) or not isinstance(i, int) for i in layers):
            raise ShapeError(f"Qwen3MoeConfig: mlp_only_layers must be a tuple of ints, got {layers!r}")

    def is_sparse(self, layer: int) -> bool:
        """Whether layer ``layer``'s MLP is the mixture of experts (transformers' rule), else dense."""
        return (
            layer not in self.mlp_only_layers and self.num_experts > 0 and (layer + 1) % self.decoder_sparse_step == 0
        )


def read_config(path: Any) -> Qwen3MoeConfig:
    """A Qwen3MoeConfig from a Hugging Face qwen3_moe ``config.json`` (a file or its directory)."""
    d, p, fail = read_family_config(path, "Qwen3-MoE config", MODEL_TYPE)
    d = dict(d)
    if "num_local_experts" in d:  # transformers 5's saved name (attribute_map of num_experts)
        if "num_experts" in d and d["num_experts"] != d["num_local_experts"]:
            fail(f"num_experts {d['num_experts']!r} and num_local_experts {d['num_local_experts']!r} differ")
        d["num_experts"] = d["num_local_experts"]
    for key in MOE_FIELDS:
        if key not in d:
            fail(f"missing key {key!r} (a mixture-of-experts config needs {', '.join(MOE_FIELDS)})")
    e = d["num_experts"]
    if isinstance(e, bool) or not isinstance(e, int) or e < 0:
        fail(f"num_experts must be an integer >= 0, got {e!r}")
    for key in ("num_experts_per_tok", "moe_intermediate_size"):
        v = d[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            fail(f"{key} must be a positive integer, got {v!r}")
    if e and d["num_experts_per_tok"] > e:
        fail(f"num_experts_per_tok {d['num_experts_per_tok']} is more than num_experts {e} (each token picks k of E)")
    step = d.get("decoder_sparse_step", 1)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        fail(f"decoder_sparse_step must be a positive integer, got {step!r}")
    norm = d.get("norm_topk_prob", False)
    if not isinstance(norm, bool):
        fail(f"norm_topk_prob must be true or false, got {norm!r}")
    only = d.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in only):
        fail(f"mlp_only_layers must be a list of layer indices (integers >= 0) or null, got {only!r}")
    bias = d.get("attention_bias", False)
    if not isinstance(bias, bool):
        fail(f"attention_bias must be true or false, got {bias!r}")
    # The Llama reader, on the fields Qwen3-MoE shares with llama (attention_bias: q, k, v and o; no MLP bias).
    base = config_from_dict(
        {**d, "model_type": "llama", "sliding_window": None, "mlp_bias": False}, p, "Qwen3-MoE config"
    )
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(LlamaConfig)}
    layers = base.num_hidden_layers  # every layer slides when use_sliding_window is true
    windows = family_layer_windows(
        d, lambda: ["sliding_attention"] * layers, layers, base.max_position_embeddings, fail
    )
    return Qwen3MoeConfig(
        **{**values, "model_type": MODEL_TYPE, "qk_norm": True, "layer_windows": windows},
        num_experts=e,
        num_experts_per_tok=d["num_experts_per_tok"],
        moe_intermediate_size=d["moe_intermediate_size"],
        norm_topk_prob=norm,
        decoder_sparse_step=step,
        mlp_only_layers=tuple(only),
    )


def qwen3_moe_hf_config(config: Qwen3MoeConfig, dtype: str = "float32") -> dict[str, Any]:
    """A transformers 5 qwen3_moe ``config.json`` dictionary for ``config`` (``num_experts`` as the released
    checkpoints write it)."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(LlamaConfig)}
    out = hf_config(LlamaConfig(**{**values, "model_type": "llama", "qk_norm": False, "layer_windows": ()}), dtype)
    out.pop("mlp_bias", None)
    out.update(
        architectures=["Qwen3MoeForCausalLM"],
        model_type=MODEL_TYPE,
        attention_bias=config.qkv_bias,
        **window_fields(config),
        num_experts=config.num_experts,
        num_experts_per_tok=config.num_experts_per_tok,
        moe_intermediate_size=config.moe_intermediate_size,
        norm_topk_prob=config.norm_topk_prob,
        decoder_sparse_step=config.decoder_sparse_step,
        mlp_only_layers=list(config.mlp_only_layers),
    )
    return out
