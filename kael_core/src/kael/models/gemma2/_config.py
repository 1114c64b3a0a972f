"""``Gemma2Config``: the shape of a Gemma 2 model, and its Hugging Face ``config.json``.

Gemma 2 is Gemma 3's layer (``kael.models.gemma3.GemmaConfig``) without the per-head q/k norms, with one rotary
setting for every layer (``rope_theta``, default 10000, and its scaling), attention soft-capping
(``attn_logit_softcapping``, default 50: scores = cap * tanh(scores / cap) before the mask and softmax),
final logit soft-capping (default 30) and, when ``layer_types`` is null, alternating layers: sliding on the even
ones, full on the odd ones (transformers' ``Gemma2Config``). ``read_config`` is the Gemma reader
(``kael.models.gemma3.read_gemma_config``): every value kael cannot run is a FormatError naming the file and
the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..gemma3._config import GemmaConfig, gemma_hf_config, read_gemma_config

__all__ = ["Gemma2Config", "read_config", "gemma2_hf_config", "MODEL_TYPE"]

MODEL_TYPE = "gemma2"


@dataclass(frozen=True)
class Gemma2Config(GemmaConfig):
    """A ``GemmaConfig`` of model type ``"gemma2"``: soft-capping, alternating layers, one rope for all."""

    model_types: ClassVar[tuple[str, ...]] = (MODEL_TYPE,)
    default_pattern: ClassVar[int] = 2

    model_type: str = MODEL_TYPE
    qk_norm: bool = False
    rope_theta: float = 10000.0
    attn_logit_softcapping: float | None = 50.0
    final_logit_softcapping: float | None = 30.0

    def __post_init__(self) -> None:
        super().__post_init__()
        # one rotary setting: the sliding layers' is the full layers'
        object.__setattr__(self, "sliding_rope_theta", self.rope_theta)
        object.__setattr__(self, "sliding_rope_scaling", self.rope_scaling)


def read_config(path: Any) -> Gemma2Config:
    """A Gemma2Config from a Hugging Face gemma2 ``config.json`` (a file or its directory)."""
    cfg = read_gemma_config(path, "Gemma2 config", MODEL_TYPE, Gemma2Config, gemma3=False)
    assert isinstance(cfg, Gemma2Config)
    return cfg


def gemma2_hf_config(config: GemmaConfig, dtype: str = "float32") -> dict[str, Any]:
    """A transformers 5 gemma2 ``config.json`` dictionary for ``config`` (one ``rope_parameters`` dict)."""
    out = gemma_hf_config(config, dtype, "Gemma2ForCausalLM")
    out["use_bidirectional_attention"] = None
    return out
