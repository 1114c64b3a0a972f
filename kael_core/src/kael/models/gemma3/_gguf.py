"""GGUF's ``gemma3`` architecture (and ``gemma2``), mapped onto ``Gemma3ForCausalLM`` (``Gemma2ForCausalLM``).

llama.cpp's names (``gguf`` ``MODEL_ARCH.GEMMA3`` / ``GEMMA2``), row-major shapes for C hidden, H heads,
Hkv key/value heads, D head_dim, F intermediate, V vocabulary:

    token_embd.weight [V, C]            model.embed_tokens (the tied head; output.weight when untied)
    blk.N.attn_norm.weight [C]          model.layers.N.input_layernorm
    blk.N.attn_q/k/v/output.weight      ...self_attn.q_proj / k_proj / v_proj / o_proj (NEOX rope: rows as stored)
    blk.N.attn_q_norm / attn_k_norm [D] ...self_attn.q_norm / k_norm (gemma3)
    blk.N.post_attention_norm [C]       ...post_attention_layernorm
    blk.N.ffn_norm [C]                  ...pre_feedforward_layernorm
    blk.N.post_ffw_norm [C]             ...post_feedforward_layernorm
    blk.N.ffn_gate/up/down.weight       ...mlp.gate_proj / up_proj / down_proj
    output_norm.weight [C]              model.norm

NOTE [gemma gguf norms]: llama.cpp's converter stores every norm weight as ``1 + w`` (its RMSNorm multiplies
by the weight as stored), kael's parameters hold transformers' ``w``: ``finish`` subtracts 1 after loading,
``save_gguf`` writes ``1 + w`` (the norm specs are constants of ``export_specs``, ``constant_tensor``'s data).

What a GGUF file does not say, kael takes from llama.cpp's loader: the softmax scale is 1/sqrt(head_dim)
(``query_pre_attn_scalar`` = head_dim), except for the 27B models (gemma3 with 62 layers, gemma2 with 46),
whose scalar is C / H; a ``gemma3`` sliding layer's rotary base is 10000 without scaling; the sliding layers
are every layer but each sixth (``attention.sliding_window_pattern``, a period or one flag per layer, when the
file has it), or none without ``attention.sliding_window``; ``gemma2`` alternates, sliding first.
``save_gguf`` refuses a model that differs from what llama.cpp would read back. Metadata besides Llama's:
``attention.sliding_window``, ``final_logit_softcapping`` and (gemma2) ``attn_logit_softcapping``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..._errors import FormatError, KaelError
from .._gguf import ROLE_FLOAT, ROLE_LINEAR, ROLE_TABLE, TensorSpec, _submodule, meta_float, meta_int
from .._gguf_llama import _rope_scaling, _token_id
from ..llama import RopeScaling
from ._config import LAYER_TYPES, Gemma3Config, GemmaConfig, default_layer_types
from ._model import Gemma3ForCausalLM, GemmaForCausalLM, GemmaRMSNorm

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
    "gguf_expressible",
]

ARCHITECTURES = ("gemma3", "gemma2")
_LARGE = {"gemma3": 62, "gemma2": 46}  # llama.cpp's LLM_TYPE_27B layer counts: scale by C / H
_SLIDING_THETA = 10000.0  # llama.cpp's gemma3 rope_freq_base_train_swa
_TABLE, _HEAD = "token_embd.weight", "output.weight"


def _classes(arch: str) -> tuple[type[GemmaConfig], type[GemmaForCausalLM]]:
    if arch == "gemma2":
        from ..gemma2 import Gemma2Config, Gemma2ForCausalLM

        return Gemma2Config, Gemma2ForCausalLM
    return Gemma3Config, Gemma3ForCausalLM


def _scalar(arch: str, layers: int, hidden: int, heads: int, head_dim: int) -> float:
    """llama.cpp's ``query_pre_attn_scalar``: C / H for the 27B models, else head_dim."""
    return float(hidden // heads) if layers == _LARGE[arch] else float(head_dim)


def _layer_types(arch: str, metadata: Mapping[str, Any], layers: int, window: int | None, where: str) -> list[str]:
    if window is None:
        return ["full_attention"] * layers
    if arch == "gemma2":
        return list(default_layer_types(layers, 2))
    key = f"{arch}.attention.sliding_window_pattern"
    pattern = metadata.get(key, 6)
    if isinstance(pattern, list):
        if len(pattern) != layers or any(not isinstance(f, bool) for f in pattern):
            raise FormatError(f"{where}: metadata {key!r} must be {layers} booleans (one per layer), got {pattern!r}")
        return [LAYER_TYPES[0] if f else LAYER_TYPES[1] for f in pattern]
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise FormatError(
            f"{where}: metadata {key!r} must be a positive integer or a list of booleans, got {pattern!r}"
        )
    return list(default_layer_types(layers, pattern))


def config_from_metadata(arch: str, metadata: Mapping[str, Any], tensors: Mapping[str, Any], where: str) -> GemmaConfig:
    """The Gemma3Config (Gemma2Config) of a ``gemma3`` (``gemma2``) GGUF file (tying and biases from its tensors)."""
    a = arch
    c = meta_int(metadata, f"{a}.embedding_length", where)
    heads = meta_int(metadata, f"{a}.attention.head_count", where)
    kv = meta_int(metadata, f"{a}.attention.head_count_kv", where, heads)
    hd = meta_int(metadata, f"{a}.attention.key_length", where, c // heads if c % heads == 0 else None)
    if meta_int(metadata, f"{a}.attention.value_length", where, hd) != hd:
        raise FormatError(f"{where}: attention.value_length differs from key_length {hd}: not supported")
    if meta_int(metadata, f"{a}.rope.dimension_count", where, hd) != hd:
        raise FormatError(f"{where}: metadata '{a}.rope.dimension_count' is not the head dim {hd}: partial rotary")
    layers = meta_int(metadata, f"{a}.block_count", where)
    table = tensors.get(_TABLE)
    rows = int(table.shape[0]) if table is not None and len(table.shape) == 2 else None
    window = metadata.get(f"{a}.attention.sliding_window")
    window = meta_int(metadata, f"{a}.attention.sliding_window", where) if window else None
    ctx = meta_int(metadata, f"{a}.context_length", where)

    def cap(key: str) -> float | None:
        v = metadata.get(f"{a}.{key}")
        return None if v is None or v == 0 else meta_float(metadata, f"{a}.{key}", where)

    cfg_class, _ = _classes(a)
    theta = meta_float(metadata, f"{a}.rope.freq_base", where, 10000.0)
    try:
        return cfg_class(
            vocab_size=meta_int(metadata, f"{a}.vocab_size", where, rows),
            hidden_size=c,
            intermediate_size=meta_int(metadata, f"{a}.feed_forward_length", where),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=hd,
            max_position_embeddings=ctx,
            rms_norm_eps=meta_float(metadata, f"{a}.attention.layer_norm_rms_epsilon", where, 1e-6),
            rope_theta=theta,
            rope_scaling=_rope_scaling(a, metadata, where),
            tie_word_embeddings=_HEAD not in tensors,
            qkv_bias="blk.0.attn_q.bias" in tensors,
            o_bias="blk.0.attn_output.bias" in tensors,
            bos_token_id=_token_id(metadata, "bos"),
            eos_token_id=_token_id(metadata, "eos"),
            query_pre_attn_scalar=_scalar(a, layers, c, heads, hd),
            sliding_window=window if window is not None else ctx,
            layer_types=tuple(_layer_types(a, metadata, layers, window, where)),
            sliding_rope_theta=_SLIDING_THETA if a == "gemma3" else theta,
            attn_logit_softcapping=cap("attn_logit_softcapping") if a == "gemma2" else None,
            final_logit_softcapping=cap("final_logit_softcapping"),
        )
    except KaelError as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{where}: the {a} metadata is not a valid model: {exc}") from None


def _norms(config: GemmaConfig) -> set[str]:
    """The GGUF names of every norm weight (stored 1 + w, NOTE [gemma gguf norms])."""
    names = {"output_norm.weight"}
    for i in range(config.num_hidden_layers):
        kinds = ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")
        names.update(
            f"blk.{i}.{k}.weight" for k in (*kinds, *(("attn_q_norm", "attn_k_norm") if config.qk_norm else ()))
        )
    return names


def tensor_specs(config: GemmaConfig) -> list[TensorSpec]:
    """Every tensor of a GGUF file of ``config`` (the one ``save_gguf`` writes too)."""
    c, f, v = config.hidden_size, config.intermediate_size, config.vocab_size
    h, kv, d = config.num_attention_heads, config.kv_heads, config.dim
    specs = [TensorSpec(_TABLE, "model.embed_tokens.weight", (v, c), ROLE_TABLE)]
    for i in range(config.num_hidden_layers):
        b, m = f"blk.{i}.", f"model.layers.{i}."
        norms = [("attn_norm", "input_layernorm", c), ("post_attention_norm", "post_attention_layernorm", c)]
        norms += [("ffn_norm", "pre_feedforward_layernorm", c), ("post_ffw_norm", "post_feedforward_layernorm", c)]
        if config.qk_norm:
            norms += [("attn_q_norm", "self_attn.q_norm", d), ("attn_k_norm", "self_attn.k_norm", d)]
        specs += [TensorSpec(f"{b}{gg}.weight", f"{m}{kael}.weight", (n,)) for gg, kael, n in norms]
        projections = (
            ("attn_q", "self_attn.q_proj", h * d, c, config.qkv_bias),
            ("attn_k", "self_attn.k_proj", kv * d, c, config.qkv_bias),
            ("attn_v", "self_attn.v_proj", kv * d, c, config.qkv_bias),
            ("attn_output", "self_attn.o_proj", c, h * d, config.o_bias),
            ("ffn_gate", "mlp.gate_proj", f, c, False),
            ("ffn_up", "mlp.up_proj", f, c, False),
            ("ffn_down", "mlp.down_proj", c, f, False),
        )
        for gg, kael, out_f, in_f, bias in projections:
            specs.append(TensorSpec(f"{b}{gg}.weight", f"{m}{kael}.weight", (out_f, in_f), ROLE_LINEAR))
            if bias:
                specs.append(TensorSpec(f"{b}{gg}.bias", f"{m}{kael}.bias", (out_f,), ROLE_FLOAT))
    specs.append(TensorSpec("output_norm.weight", "model.norm.weight", (c,)))
    if not config.tie_word_embeddings:
        specs.append(TensorSpec(_HEAD, "lm_head.weight", (v, c), ROLE_LINEAR))
    return specs


def export_specs(model: GemmaForCausalLM) -> list[TensorSpec]:
    """``tensor_specs`` with the norms as constants: ``constant_tensor`` writes them as 1 + w."""
    norms = _norms(model.config)
    return [dataclasses.replace(s, constant=True) if s.name in norms else s for s in tensor_specs(model.config)]


def constant_tensor(model: GemmaForCausalLM, spec: TensorSpec) -> np.ndarray:
    """A norm's stored weight: ``1 + w`` in float32 (NOTE [gemma gguf norms])."""
    if spec.name not in _norms(model.config):
        raise KaelError(f"save_gguf: {spec.name!r} is not a tensor this model's config holds")
    from ... import _dtype as dt
    from ...ops import detach, to

    module = _submodule(model, spec.target.rsplit(".", 1)[0])
    w = np.asarray(to(detach(module.weight), dtype=dt.float32).numpy(), dtype=np.float32)
    return np.asarray(w + np.float32(1.0), dtype=np.float32)


def new_model(config: GemmaConfig, device: Any) -> GemmaForCausalLM:
    _, cls = _classes("gemma2" if config.model_type == "gemma2" else "gemma3")
    return cls(config, device=device, init=False)


def check_extra(f: Any, where: str) -> None:
    """Nothing beyond the tensor specs (tying and biases were read from the tensors present)."""


def skip_tensor(spec: TensorSpec) -> bool:
    return False


def finish(model: GemmaForCausalLM, mmap: bool) -> None:
    """Norm weights from llama.cpp's ``1 + w`` to ``w`` (NOTE [gemma gguf norms]); a float copy-mode load then
    fuses q/k/v and gate/up as ``from_pretrained`` does (NOTE [fused projections])."""
    from ...autograd import no_grad
    from ...ops import sub
    from ...ops._inplace import copy_

    with no_grad():
        for module in model.modules():
            if isinstance(module, GemmaRMSNorm):
                copy_(module.weight, sub(module.weight, 1.0))
    if mmap or model.weights_scheme is not None:
        return
    from ..llama._checkpoint import fuse_projections

    fuse_projections(model)


def gguf_expressible(config: GemmaConfig) -> GemmaConfig:
    """``config`` with what a GGUF file cannot say set to what llama.cpp reads (the tensors are the same)."""
    a = "gemma2" if config.model_type == "gemma2" else "gemma3"
    c = config
    return dataclasses.replace(
        c,
        query_pre_attn_scalar=_scalar(a, c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.dim),
        layer_types=tuple(_layer_types(a, {}, c.num_hidden_layers, c.sliding_window, "save_gguf")),
        sliding_rope_theta=_SLIDING_THETA if a == "gemma3" else c.rope_theta,
        sliding_rope_scaling=RopeScaling() if a == "gemma3" else c.rope_scaling,
    )


def handles(model: Any) -> bool:
    return isinstance(model, GemmaForCausalLM)


def gguf_metadata(model: GemmaForCausalLM) -> tuple[str, dict[str, Any]]:
    c = model.config
    a = "gemma2" if c.model_type == "gemma2" else "gemma3"

    def refuse(what: str) -> None:
        raise KaelError(f"save_gguf: {what}, which a {a} GGUF file cannot say (llama.cpp would read another model)")

    want = _scalar(a, c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.dim)
    if float(c.query_pre_attn_scalar) != want:
        refuse(f"query_pre_attn_scalar {c.query_pre_attn_scalar} is not llama.cpp's {want}")
    pattern = tuple(_layer_types(a, {}, c.num_hidden_layers, c.sliding_window, "save_gguf"))
    if c.layer_types != pattern:
        refuse(f"layer_types {list(c.layer_types or ())} are not llama.cpp's {a} pattern")
    if a == "gemma3" and (c.sliding_rope_theta != _SLIDING_THETA or c.sliding_rope_scaling.rope_type != "default"):
        refuse(f"the sliding layers' rope (theta {c.sliding_rope_theta}) is not llama.cpp's (10000, no scaling)")
    if a == "gemma2" and (c.sliding_rope_theta, c.sliding_rope_scaling) != (c.rope_theta, c.rope_scaling):
        refuse("the sliding layers' rope differs from the full layers'")
    out: dict[str, Any] = {
        f"{a}.vocab_size": c.vocab_size,
        f"{a}.context_length": c.max_position_embeddings,
        f"{a}.embedding_length": c.hidden_size,
        f"{a}.block_count": c.num_hidden_layers,
        f"{a}.feed_forward_length": c.intermediate_size,
        f"{a}.rope.dimension_count": c.dim,
        f"{a}.attention.head_count": c.num_attention_heads,
        f"{a}.attention.head_count_kv": c.kv_heads,
        f"{a}.attention.key_length": c.dim,
        f"{a}.attention.value_length": c.dim,
        f"{a}.attention.layer_norm_rms_epsilon": float(c.rms_norm_eps),
        f"{a}.attention.sliding_window": c.sliding_window,
        f"{a}.rope.freq_base": float(c.rope_theta),
    }
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        v = getattr(c, key)
        if v is not None:
            out[f"{a}.{key}"] = float(v)
    kind = c.rope_scaling.rope_type
    if kind == "linear":
        out[f"{a}.rope.scaling.type"] = "linear"
        out[f"{a}.rope.scaling.factor"] = float(c.rope_scaling.get("factor"))
    elif kind not in ("default", "dynamic"):
        raise KaelError(f"save_gguf: rope type {kind!r} cannot be written to GGUF by kael (default and linear can)")
    return a, out
