"""GGUF's ``phi3`` architecture (llama.cpp's ``MODEL_ARCH.PHI3``, as ``convert_hf_to_gguf.py``'s Phi3MiniModel
writes it), mapped onto ``kael.models.Phi3ForCausalLM``.

Tensors, row-major, for C hidden, H heads, Hkv key/value heads, D head_dim, F intermediate, V vocabulary, R
rotary dims (no row reordering: llama.cpp runs Phi-3 with NEOX rope, Hugging Face's rotate-half):

    token_embd.weight [V, C]                model.embed_tokens     output_norm.weight [C]  model.norm
    output.weight [V, C]                    lm_head (absent: tied to token_embd)
    rope_factors_long.weight [R/2]          longrope's long_factor   (F32; both present or both absent)
    rope_factors_short.weight [R/2]         longrope's short_factor
    blk.N.attn_norm.weight [C]              model.layers.N.input_layernorm
    blk.N.attn_qkv.weight [(H+2Hkv)*D, C]   ...self_attn.qkv_proj  blk.N.attn_output.weight [C, H*D]  ...o_proj
    blk.N.ffn_norm.weight [C]               ...post_attention_layernorm
    blk.N.ffn_up.weight [2F, C]             ...mlp.gate_up_proj (gate's rows, then up's)
    blk.N.ffn_down.weight [C, F]            ...mlp.down_proj

Metadata (``phi3.``): the Llama keys (``context_length``, ``embedding_length``, ``feed_forward_length``,
``block_count``, ``attention.head_count``, ``attention.head_count_kv``, ``attention.layer_norm_rms_epsilon``,
``rope.freq_base``), ``rope.dimension_count`` (R: ``partial_rotary_factor = R / D``),
``rope.scaling.original_context_length`` (longrope's ``original_max_position_embeddings``),
``rope.scaling.attn_factor`` (the converter's attention factor, with the factor tensors) and
``attention.sliding_window`` (0: none; a window shorter than the context: every layer's sliding window).

NOTE [phi3 file name]: ``save_gguf`` names a phi3 file ``general.name = "Phi 3"``, not ``"phi3"`` as other
families are named after their architecture: llama.cpp gives the special tokens of a file whose lowercased name
contains ``phi3`` or ``phi-3`` Phi-3's rstrip flags and refuses the file when its vocabulary lacks one of
``</s> <unk> <s> <|endoftext|>`` (NOTE [phi-3 rstrip] in kael/tokenizer/_gguf.py). kael writes byte-level BPE
vocabularies only (Phi-4-mini's, say), which have neither those tokens nor those flags, so its files keep a
name that llama.cpp reads them by as written.

What llama.cpp does differently with these files (tests/core/test_phi3_gguf.py runs both): it picks longrope's
list once per context, the long one when the context size (``n_ctx`` rounded up to 256) exceeds
``rope.scaling.original_context_length``, where kael (as transformers) picks it per pass by the positions
(NOTE [longrope factors] in phi3/_rope.py): the two agree on a prompt shorter than the original length in a
context no longer, and on any prompt longer than it; and its phi3 graph ignores ``attention.sliding_window``
(it logs "Phi SWA is currently disabled" and attends to the whole context), where kael slides every layer's
window as transformers does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._errors import FormatError, KaelError
from ._gguf import ROLE_FLOAT, ROLE_LINEAR, ROLE_TABLE, TensorSpec, meta_float, meta_int
from .phi3 import LongRope, Phi3Config, Phi3ForCausalLM

__all__ = [
    "ARCHITECTURES",
    "config_from_metadata",
    "tensor_specs",
    "export_specs",
    "new_model",
    "check_extra",
    "skip_tensor",
    "constant_tensor",
    "finish",
    "handles",
    "gguf_metadata",
]

ARCHITECTURES = ("phi3",)
_A = "phi3"
_TABLE, _HEAD = "token_embd.weight", "output.weight"
_LONG, _SHORT = "rope_factors_long.weight", "rope_factors_short.weight"


def _token_id(metadata: Mapping[str, Any], name: str) -> int | None:
    v = metadata.get(f"tokenizer.ggml.{name}_token_id")
    return v if type(v) is int else None


def _factors(tensors: Mapping[str, Any], name: str, n: int, where: str) -> tuple[float, ...]:
    t = tensors[name]
    if t.type != "F32" or tuple(t.shape) != (n,):
        raise FormatError(
            f"{where}: tensor {name!r} must be F32 of shape [{n}] (rotary dims / 2), got {t.type} {list(t.shape)}"
        )
    values = np.asarray(t.data, dtype=np.float64)
    if not (np.isfinite(values).all() and (values > 0).all()):
        raise FormatError(f"{where}: tensor {name!r} must hold finite positive factors")
    return tuple(float(x) for x in values)


def config_from_metadata(arch: str, metadata: Mapping[str, Any], tensors: Mapping[str, Any], where: str) -> Phi3Config:
    """The Phi3Config of a ``phi3`` GGUF file (tying from whether ``output.weight`` is there, longrope from the
    factor tensors)."""
    a = _A
    c = meta_int(metadata, f"{a}.embedding_length", where)
    heads = meta_int(metadata, f"{a}.attention.head_count", where)
    if c % heads:
        raise FormatError(f"{where}: embedding_length {c} is not divisible by attention.head_count {heads}")
    hd = c // heads
    rot = meta_int(metadata, f"{a}.rope.dimension_count", where, hd)
    if rot > hd or rot % 2 or int(hd * (rot / hd)) != rot:
        raise FormatError(
            f"{where}: metadata '{a}.rope.dimension_count' {rot} must be even and at most the head dim {hd}"
        )
    ctx = meta_int(metadata, f"{a}.context_length", where)
    orig = meta_int(metadata, f"{a}.rope.scaling.original_context_length", where, ctx)
    window = metadata.get(f"{a}.attention.sliding_window", 0)
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise FormatError(f"{where}: metadata '{a}.attention.sliding_window' must be an integer >= 0, got {window!r}")
    longrope = None
    if (_LONG in tensors) != (_SHORT in tensors):
        raise FormatError(f"{where}: {_LONG!r} and {_SHORT!r} must both be present or both absent")
    if _LONG in tensors:
        attn = metadata.get(f"{a}.rope.scaling.attn_factor")
        longrope = LongRope(
            _factors(tensors, _SHORT, rot // 2, where),
            _factors(tensors, _LONG, rot // 2, where),
            orig,
            None,
            None if attn is None else meta_float(metadata, f"{a}.rope.scaling.attn_factor", where),
        )
    table = tensors.get(_TABLE)
    rows = int(table.shape[0]) if table is not None and len(table.shape) == 2 else None
    try:
        return Phi3Config(
            vocab_size=meta_int(metadata, f"{a}.vocab_size", where, rows),
            hidden_size=c,
            intermediate_size=meta_int(metadata, f"{a}.feed_forward_length", where),
            num_hidden_layers=meta_int(metadata, f"{a}.block_count", where),
            num_attention_heads=heads,
            num_key_value_heads=meta_int(metadata, f"{a}.attention.head_count_kv", where, heads),
            head_dim=hd,
            max_position_embeddings=ctx,
            rms_norm_eps=meta_float(metadata, f"{a}.attention.layer_norm_rms_epsilon", where, 1e-5),
            rope_theta=meta_float(metadata, f"{a}.rope.freq_base", where, 10000.0),
            tie_word_embeddings=_HEAD not in tensors,
            bos_token_id=_token_id(metadata, "bos"),
            eos_token_id=_token_id(metadata, "eos"),
            partial_rotary_factor=rot / hd,
            longrope=longrope,
            sliding_window=window or None,
            original_max_position_embeddings=orig,
        )
    except KaelError as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{where}: the phi3 metadata is not a valid model: {exc}") from None


def tensor_specs(config: Phi3Config) -> list[TensorSpec]:
    """Every tensor of a ``phi3`` GGUF file of ``config`` (the one ``save_gguf`` writes too)."""
    c, f, v = config.hidden_size, config.intermediate_size, config.vocab_size
    h, kv, d = config.num_attention_heads, config.kv_heads, config.dim
    specs = [TensorSpec(_TABLE, "model.embed_tokens.weight", (v, c), ROLE_TABLE)]
    if config.longrope is not None:
        n = config.rotary_dim // 2
        specs.insert(0, TensorSpec(_SHORT, "", (n,), ROLE_FLOAT, constant=True))
        specs.insert(0, TensorSpec(_LONG, "", (n,), ROLE_FLOAT, constant=True))
    for i in range(config.num_hidden_layers):
        b, m = f"blk.{i}.", f"model.layers.{i}."
        specs += [
            TensorSpec(f"{b}attn_norm.weight", f"{m}input_layernorm.weight", (c,)),
            TensorSpec(f"{b}attn_qkv.weight", f"{m}self_attn.qkv_proj.weight", ((h + 2 * kv) * d, c), ROLE_LINEAR),
            TensorSpec(f"{b}attn_output.weight", f"{m}self_attn.o_proj.weight", (c, h * d), ROLE_LINEAR),
            TensorSpec(f"{b}ffn_norm.weight", f"{m}post_attention_layernorm.weight", (c,)),
            TensorSpec(f"{b}ffn_up.weight", f"{m}mlp.gate_up_proj.weight", (2 * f, c), ROLE_LINEAR),
            TensorSpec(f"{b}ffn_down.weight", f"{m}mlp.down_proj.weight", (c, f), ROLE_LINEAR),
        ]
    specs.append(TensorSpec("output_norm.weight", "model.norm.weight", (c,)))
    if not config.tie_word_embeddings:
        specs.append(TensorSpec(_HEAD, "lm_head.weight", (v, c), ROLE_LINEAR))
    return specs


def constant_tensor(model: Phi3ForCausalLM, spec: TensorSpec) -> np.ndarray:
    """The data of a constant spec: longrope's factor lists."""
    lr = model.config.longrope
    if lr is None or spec.name not in (_LONG, _SHORT):
        raise KaelError(f"save_gguf: {spec.name!r} is not a tensor this model's config holds")
    return np.asarray(lr.long_factor if spec.name == _LONG else lr.short_factor, dtype=np.float32)


def export_specs(model: Phi3ForCausalLM) -> list[TensorSpec]:
    return tensor_specs(model.config)


def new_model(config: Phi3Config, device: Any) -> Phi3ForCausalLM:
    return Phi3ForCausalLM(config, device=device, init=False)


def check_extra(f: Any, where: str) -> None:
    """Nothing beyond the tensor specs (tying and longrope were read from the tensors present)."""


def skip_tensor(spec: TensorSpec) -> bool:
    return False


def finish(model: Phi3ForCausalLM, mmap: bool) -> None:
    """Nothing to fuse: q/k/v and gate/up are one tensor each in the file."""


def handles(model: Any) -> bool:
    return isinstance(model, Phi3ForCausalLM)


def gguf_metadata(model: Phi3ForCausalLM) -> tuple[str, dict[str, Any]]:
    c, a = model.config, _A
    if c.dim * c.num_attention_heads != c.hidden_size:
        raise KaelError(f"save_gguf: phi3 files have head_dim = hidden_size / heads, this model's is {c.dim}")
    lr = c.longrope
    out: dict[str, Any] = {
        "general.name": "Phi 3",  # NOTE [phi3 file name]
        f"{a}.vocab_size": c.vocab_size,
        f"{a}.context_length": c.max_position_embeddings,
        f"{a}.rope.scaling.original_context_length": (
            lr.original_max_position_embeddings if lr is not None else c.original_max_position_embeddings
        ),
        f"{a}.embedding_length": c.hidden_size,
        f"{a}.feed_forward_length": c.intermediate_size,
        f"{a}.block_count": c.num_hidden_layers,
        f"{a}.attention.head_count": c.num_attention_heads,
        f"{a}.attention.head_count_kv": c.kv_heads,
        f"{a}.attention.layer_norm_rms_epsilon": float(c.rms_norm_eps),
        f"{a}.rope.dimension_count": c.rotary_dim,
        f"{a}.rope.freq_base": float(c.rope_theta),
        f"{a}.attention.sliding_window": c.sliding_window or 0,
    }
    if lr is not None:
        out[f"{a}.rope.scaling.attn_factor"] = float(c.attention_scale)
    return a, out
