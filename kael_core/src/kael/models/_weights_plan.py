"""The weight format of each tensor of a model under a ``weights`` choice (NOTE [weights choice]).

A family that ``save_gguf`` knows lists its tensors under their GGUF names, in file order
(``export_specs``). ``gguf_plan`` runs llama.cpp's per-tensor rules
(``kael.quant.formats.mix_types``, NOTE [quantization mixes]) over that list, with the head
counts and layer count of the model's GGUF metadata, so kael quantizes each tensor as
``llama-quantize`` does on the same F32 file: a mix (``"q4_k_m"``) gives some ``attn_v`` and
``ffn_down`` tensors more bits, every block format gives the output head Q6_K (Q8_0 for q8_0
files or rows Q6_K cannot hold), and rows no block fits fall back. ``module_plan`` says the same
per kael module (``"h.0.attn.c_attn"``, ``"model.embed_tokens"``, ``"lm_head"``); the families'
``quantization_plan`` hook returns it, and ``kael.quantize`` and ``quantize_embeddings`` follow it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .._errors import KaelError

__all__ = ["gguf_family", "gguf_plan", "module_plan"]


def gguf_family(model: Any) -> ModuleType | None:
    """The GGUF module of ``model``'s family (``_gguf_gpt2``, ``_gguf_llama``), None for another model."""
    from ._gguf import _arch_modules

    for m in _arch_modules():
        if m.handles(model):
            return m
    return None


def gguf_plan(model: Any, weights: str) -> dict[str, str | None]:
    """GGUF tensor name -> format (None: kept float32) of ``model`` quantized to ``weights``, in file order.

    ``weights``: a llama.cpp file type of ``kael.quant.formats.MIXES`` or a format name (a
    uniform plan); a KaelError for a model whose family has no GGUF layout.
    """
    return _plan(model, weights)[1]


def module_plan(model: Any, weights: str) -> dict[str, str | None]:
    """Qualified module name -> format (None: stays float) of every projection and token table of ``model``
    under ``weights`` (``gguf_plan`` by the modules the GGUF tensors are the weights of)."""
    from ._gguf import ROLE_FLOAT

    specs, plan = _plan(model, weights)
    return {s.target.rsplit(".", 1)[0]: plan.get(s.name) for s in specs if s.role != ROLE_FLOAT}


def _plan(model: Any, weights: str) -> tuple[list[Any], dict[str, str | None]]:
    """The family's tensor specs of ``model`` and ``mix_types`` over them."""
    from ..quant.formats import mix_types

    fam = gguf_family(model)
    if fam is None:
        raise KaelError(
            f"quantization plan: {type(model).__name__} has no GGUF layout in kael; expected a model "
            "whose family save_gguf knows (GPT-2, the Llama family)"
        )
    arch, meta = fam.gguf_metadata(model)
    n_head = int(meta[f"{arch}.attention.head_count"])
    specs = fam.export_specs(model)
    plan = mix_types(
        weights,
        [(s.name, s.shape) for s in specs],
        n_head=n_head,
        n_head_kv=int(meta.get(f"{arch}.attention.head_count_kv", n_head)),
        n_layer=int(meta[f"{arch}.block_count"]),
        arch=arch,
    )
    return specs, plan
