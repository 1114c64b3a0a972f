"""GGUF's ``gpt2`` architecture: its metadata keys and tensor names, mapped onto ``kael.models.GPT``.

llama.cpp's names (``gguf`` ``MODEL_ARCH.GPT2``; ``LLM_ARCH_GPT2`` in ``llama-model.cpp``):

    token_embd.weight [V, C]            wte.weight          position_embd.weight [P, C]  wpe.weight
    blk.N.attn_norm.{weight,bias} [C]   h.N.ln_1            blk.N.attn_qkv.weight [3C, C] h.N.attn.c_attn
    blk.N.attn_output.weight [C, C]     h.N.attn.c_proj     blk.N.ffn_norm.{weight,bias}  h.N.ln_2
    blk.N.ffn_up.weight [4C, C]         h.N.mlp.c_fc        blk.N.ffn_down.weight [C, 4C] h.N.mlp.c_proj
    output_norm.{weight,bias} [C]       ln_f                output.weight [V, C]          (optional: tied)

each projection with its ``.bias``. GGUF stores the projections ``[out, in]``: the
transpose of GPT-2's Conv1D ``[in, out]`` (the converter transposes them). Metadata:
``gpt2.context_length``, ``gpt2.embedding_length``, ``gpt2.feed_forward_length`` (4 C, the
only width kael's GPT-2 has), ``gpt2.block_count``, ``gpt2.attention.head_count``,
``gpt2.attention.layer_norm_epsilon``; the vocabulary size is ``token_embd``'s rows. An
``output.weight`` must equal ``token_embd.weight``: kael's GPT-2 ties its head.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._errors import FormatError, KaelError
from ._gguf import ROLE_FLOAT, ROLE_LINEAR, ROLE_TABLE, TensorSpec, meta_float, meta_int
from .gpt2 import GPT, GPTConfig

__all__ = [
    "ARCHITECTURES",
    "config_from_metadata",
    "tensor_specs",
    "export_specs",
    "new_model",
    "check_extra",
    "skip_tensor",
    "finish",
    "handles",
    "gguf_metadata",
]

ARCHITECTURES = ("gpt2",)
_TABLE, _HEAD = "token_embd.weight", "output.weight"
_PROJECTIONS = (("attn_qkv", "attn.c_attn", 3, 1), ("attn_output", "attn.c_proj", 1, 1))
_MLP = (("ffn_up", "mlp.c_fc", 4, 1), ("ffn_down", "mlp.c_proj", 1, 4))


def config_from_metadata(arch: str, metadata: Mapping[str, Any], tensors: Mapping[str, Any], where: str) -> GPTConfig:
    """The GPTConfig of a ``gpt2`` GGUF file's metadata (and ``token_embd``'s rows: the vocabulary)."""
    c = meta_int(metadata, "gpt2.embedding_length", where)
    ff = meta_int(metadata, "gpt2.feed_forward_length", where, 4 * c)
    if ff != 4 * c:
        raise FormatError(
            f"{where}: metadata 'gpt2.feed_forward_length' is {ff}; kael's GPT-2 has 4 * embedding_length = {4 * c}"
        )
    table = tensors.get(_TABLE)
    if table is not None and len(table.shape) == 2:
        vocab = int(table.shape[0])
    else:
        tokens = metadata.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens:
            raise FormatError(f"{where}: missing tensor {_TABLE!r} (it gives the vocabulary size)")
        vocab = len(tokens)
    try:
        return GPTConfig(
            vocab_size=vocab,
            max_positions=meta_int(metadata, "gpt2.context_length", where),
            layers=meta_int(metadata, "gpt2.block_count", where),
            heads=meta_int(metadata, "gpt2.attention.head_count", where),
            dimension=c,
            layer_norm_epsilon=meta_float(metadata, "gpt2.attention.layer_norm_epsilon", where, 1e-5),
        )
    except KaelError as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{where}: the gpt2 metadata is not a valid GPT-2: {exc}") from None


def tensor_specs(config: GPTConfig) -> list[TensorSpec]:
    """Every tensor of a ``gpt2`` GGUF file of ``config`` (``output.weight`` optional)."""
    return [
        *export_specs_for(config),
        TensorSpec(_HEAD, "wte.weight", (config.vocab_size, config.dimension), ROLE_TABLE, optional=True),
    ]


def export_specs_for(config: GPTConfig) -> list[TensorSpec]:
    """The tensors ``save_gguf`` writes for ``config`` (the head is tied: no ``output.weight``)."""
    c, v, p = config.dimension, config.vocab_size, config.max_positions
    specs = [
        TensorSpec(_TABLE, "wte.weight", (v, c), ROLE_TABLE),
        TensorSpec("position_embd.weight", "wpe.weight", (p, c), ROLE_FLOAT),
    ]
    for i in range(config.layers):
        b, h = f"blk.{i}.", f"h.{i}."
        for gg, kael in (("attn_norm", "ln_1"), ("ffn_norm", "ln_2")):
            specs += [TensorSpec(f"{b}{gg}.{x}", f"{h}{kael}.{x}", (c,)) for x in ("weight", "bias")]
        for gg, kael, out_mul, in_mul in (*_PROJECTIONS, *_MLP):
            out_f, in_f = out_mul * c, in_mul * c
            specs.append(TensorSpec(f"{b}{gg}.weight", f"{h}{kael}.weight", (out_f, in_f), ROLE_LINEAR, transpose=True))
            specs.append(TensorSpec(f"{b}{gg}.bias", f"{h}{kael}.bias", (out_f,)))
    specs += [TensorSpec(f"output_norm.{x}", f"ln_f.{x}", (c,)) for x in ("weight", "bias")]
    return specs


def export_specs(model: GPT) -> list[TensorSpec]:
    return export_specs_for(model.config)


def new_model(config: GPTConfig, device: Any) -> GPT:
    return GPT.from_config(config, device=device, init=False)


def _values(t: Any) -> np.ndarray:
    from ._gguf import _float32

    return _float32(t)


def check_extra(f: Any, where: str) -> None:
    """An ``output.weight`` must be ``token_embd.weight`` again (kael's GPT-2 ties its LM head)."""
    head = f.tensors.get(_HEAD)
    if head is None:
        return
    table = f.tensors[_TABLE]
    same = (
        bool(np.array_equal(head.data, table.data))
        if head.type == table.type
        else bool(np.array_equal(_values(head), _values(table)))
    )
    if not same:
        raise FormatError(
            f"{where}: tensor {_HEAD!r} differs from {_TABLE!r}: an untied GPT-2 LM head is not supported"
        )


def skip_tensor(spec: TensorSpec) -> bool:
    return spec.name == _HEAD  # checked equal to the table by check_extra


def finish(model: GPT, mmap: bool) -> None:
    """Nothing to rebuild: GPT-2's loader already stores float projections out-major."""


def handles(model: Any) -> bool:
    return isinstance(model, GPT)


def gguf_metadata(model: GPT) -> tuple[str, dict[str, Any]]:
    c = model.config
    return "gpt2", {
        "gpt2.context_length": c.max_positions,
        "gpt2.embedding_length": c.dimension,
        "gpt2.feed_forward_length": 4 * c.dimension,
        "gpt2.block_count": c.layers,
        "gpt2.attention.head_count": c.heads,
        "gpt2.attention.layer_norm_epsilon": float(c.layer_norm_epsilon),
    }
