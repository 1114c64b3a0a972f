"""GGUF's ``llama``, ``qwen2``, ``qwen3``, ``granite``, ``smollm3`` and ``olmo2`` architectures, mapped onto
``kael.models.LlamaForCausalLM`` (for ``qwen3``, ``granite``, ``smollm3`` and ``olmo2``: ``Qwen3ForCausalLM``,
``GraniteForCausalLM``, ``SmolLM3ForCausalLM`` and ``Olmo2ForCausalLM`` of ``kael.models``).

llama.cpp's names (``gguf`` ``MODEL_ARCH.LLAMA`` / ``QWEN2`` / ``QWEN3`` / ``GRANITE`` / ``SMOLLM3``), row-major
shapes for C hidden,
H heads, Hkv key/value heads, D head_dim, F intermediate, V vocabulary:

    token_embd.weight [V, C]        model.embed_tokens     output_norm.weight [C]  model.norm
    output.weight [V, C]            lm_head (absent: tied to token_embd)
    blk.N.attn_norm.weight [C]      model.layers.N.input_layernorm
    blk.N.attn_q.weight [H*D, C]    ...self_attn.q_proj    blk.N.attn_k.weight [Hkv*D, C]  ...k_proj
    blk.N.attn_v.weight [Hkv*D, C]  ...v_proj              blk.N.attn_output.weight [C, H*D] ...o_proj
    blk.N.ffn_norm.weight [C]       ...post_attention_layernorm
    blk.N.ffn_gate.weight [F, C]    ...mlp.gate_proj       blk.N.ffn_up.weight [F, C]  ...up_proj
    blk.N.ffn_down.weight [C, F]    ...mlp.down_proj

with ``.bias`` tensors for q/k/v (qwen2 always; llama, granite, smollm3 and qwen3 with ``attention_bias``,
which also has ``attn_output.bias``) and gate/up/down (llama's, granite's and smollm3's ``mlp_bias``). qwen3 adds each layer's
per-head norms ``blk.N.attn_q_norm.weight`` [D] (``self_attn.q_norm``) and ``attn_k_norm``. ``olmo2``
(``MODEL_ARCH.OLMO2``) has no ``attn_norm`` or ``ffn_norm``; instead ``blk.N.post_attention_norm.weight`` [C]
(``post_attention_layernorm``) and ``blk.N.post_ffw_norm.weight`` [C] (``post_feedforward_layernorm``), and
whole-projection norms ``blk.N.attn_q_norm.weight`` [H*D] and ``attn_k_norm`` [Hkv*D]. A
llama (granite, smollm3) file's q and k rows (weights and biases) are in GGML's rope order (NOTE [gguf rope rows] in
``_gguf.py``); qwen2's, qwen3's and olmo2's are not (NEOX rope).
Mistral checkpoints are written as ``llama``, as llama.cpp's converter does.

Metadata (``{arch}.``): ``context_length``, ``embedding_length``, ``feed_forward_length``,
``block_count``, ``attention.head_count``, ``attention.head_count_kv`` (default: the heads),
``attention.layer_norm_rms_epsilon``, ``attention.key_length`` / ``value_length`` (the head
dim; default C / H), ``rope.dimension_count`` (must be the head dim: no partial rotary),
``rope.freq_base`` (default 10000), ``rope.scaling.type`` (``none`` or ``linear`` with
``rope.scaling.factor``), ``vocab_size`` (default: ``token_embd``'s rows). A ``rope_freqs.weight``
tensor [D/2] (F32: per-dimension divisors of the rotary frequencies, which llama.cpp's converter
writes for Llama 3.1's ``llama3`` scaling) becomes the config's ``rope_freq_factors`` and is
written back as it was read. ``granite`` also has ``embedding_scale``, ``residual_scale``,
``attention.scale`` and ``logit_scale`` (required, as llama.cpp requires them): GraniteConfig's
``embedding_multiplier``, ``residual_multiplier``, ``attention_multiplier`` and ``logits_scaling``.
``smollm3`` has no key for its layers without rope: llama.cpp skips rope on every fourth layer
(``n_no_rope_layer_step`` 4, transformers' default ``no_rope_layers``), so kael reads that pattern and
``save_gguf`` refuses a SmolLM3 model with another one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._errors import FormatError, KaelError
from ._gguf import ROLE_FLOAT, ROLE_LINEAR, ROLE_TABLE, TensorSpec, meta_float, meta_int
from .granite import GraniteConfig, GraniteForCausalLM
from .llama import LlamaConfig, LlamaForCausalLM, RopeScaling
from .olmo2 import Olmo2Config, Olmo2ForCausalLM
from .qwen3 import Qwen3Config, Qwen3ForCausalLM
from .smollm3 import DEFAULT_THETA, SmolLM3Config, SmolLM3ForCausalLM, no_rope_layers

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

ARCHITECTURES = ("llama", "qwen2", "qwen3", "granite", "smollm3", "olmo2")
_LLAMA_LIKE = ("llama", "granite", "smollm3")  # llama's biases, q/k rows in GGML's rope order
#: Granite's metadata keys (``{arch}.`` + key, as llama.cpp's converter writes them) and GraniteConfig's fields.
_GRANITE_KEYS = {
    "embedding_scale": "embedding_multiplier",
    "residual_scale": "residual_multiplier",
    "attention.scale": "attention_multiplier",
    "logit_scale": "logits_scaling",
}
_TABLE, _HEAD, _ROPE_FREQS = "token_embd.weight", "output.weight", "rope_freqs.weight"


def _token_id(metadata: Mapping[str, Any], name: str) -> int | None:
    v = metadata.get(f"tokenizer.ggml.{name}_token_id")
    return v if type(v) is int else None


def _rope_scaling(arch: str, metadata: Mapping[str, Any], where: str) -> RopeScaling:
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    legacy = metadata.get(f"{arch}.rope.scale_linear")
    if kind == "none" and legacy is None:
        return RopeScaling()
    if kind == "linear" or (kind == "none" and legacy is not None):
        key = f"{arch}.rope.scaling.factor" if kind == "linear" else f"{arch}.rope.scale_linear"
        factor = meta_float(metadata, key, where)
        if factor <= 0:
            raise FormatError(f"{where}: metadata {key!r} must be > 0, got {factor!r}")
        return RopeScaling("linear", {"factor": factor})
    raise FormatError(
        f"{where}: metadata '{arch}.rope.scaling.type' is {kind!r}; kael reads 'none' and 'linear' rope scaling"
    )


def config_from_metadata(arch: str, metadata: Mapping[str, Any], tensors: Mapping[str, Any], where: str) -> LlamaConfig:
    """The LlamaConfig of a ``llama`` / ``qwen2`` / ``qwen3`` / ``granite`` GGUF file (biases and tying from which
    tensors it has; a Qwen3Config for ``qwen3``, a GraniteConfig with its four scales for ``granite``, a
    SmolLM3Config without rope on every fourth layer for ``smollm3``, an Olmo2Config for ``olmo2``)."""
    a = arch
    if a == "olmo2":
        _check_no_window(metadata, where)
    c = meta_int(metadata, f"{a}.embedding_length", where)
    heads = meta_int(metadata, f"{a}.attention.head_count", where)
    kv = meta_int(metadata, f"{a}.attention.head_count_kv", where, heads)
    default_dim = c // heads if c % heads == 0 else None
    hd = meta_int(metadata, f"{a}.attention.key_length", where, default_dim)
    vd = meta_int(metadata, f"{a}.attention.value_length", where, hd)
    if vd != hd:
        raise FormatError(f"{where}: attention.key_length {hd} != attention.value_length {vd} is not supported")
    rot = meta_int(metadata, f"{a}.rope.dimension_count", where, hd)
    if rot != hd:
        raise FormatError(
            f"{where}: metadata '{a}.rope.dimension_count' is {rot}, the head dim is {hd}: partial rotary "
            "embeddings are not supported"
        )
    table = tensors.get(_TABLE)
    rows = int(table.shape[0]) if table is not None and len(table.shape) == 2 else None
    vocab = meta_int(metadata, f"{a}.vocab_size", where, rows)
    qkv_bias = "blk.0.attn_q.bias" in tensors or a == "qwen2"
    eos = _token_id(metadata, "eos")
    classes = {"qwen3": Qwen3Config, "granite": GraniteConfig, "smollm3": SmolLM3Config, "olmo2": Olmo2Config}
    cls: type[LlamaConfig] = classes.get(a, LlamaConfig)
    extra: dict[str, Any] = (
        {f: meta_float(metadata, f"{a}.{k}", where) for k, f in _GRANITE_KEYS.items()} if a == "granite" else {}
    )
    try:
        return cls(
            **extra,
            vocab_size=vocab,
            hidden_size=c,
            intermediate_size=meta_int(metadata, f"{a}.feed_forward_length", where),
            num_hidden_layers=meta_int(metadata, f"{a}.block_count", where),
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=hd,
            max_position_embeddings=meta_int(metadata, f"{a}.context_length", where),
            rms_norm_eps=meta_float(metadata, f"{a}.attention.layer_norm_rms_epsilon", where, 1e-6),
            rope_theta=meta_float(metadata, f"{a}.rope.freq_base", where, DEFAULT_THETA if a == "smollm3" else 10000.0),
            rope_scaling=_rope_scaling(a, metadata, where),
            tie_word_embeddings=_HEAD not in tensors,
            qkv_bias=qkv_bias,
            o_bias=a in (*_LLAMA_LIKE, "qwen3", "olmo2") and "blk.0.attn_output.bias" in tensors,
            mlp_bias=a in _LLAMA_LIKE and "blk.0.ffn_gate.bias" in tensors,
            model_type=a,
            bos_token_id=_token_id(metadata, "bos"),
            eos_token_id=eos,
            rope_freq_factors=_freq_factors(tensors, hd, where),
        )
    except KaelError as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{where}: the {a} metadata is not a valid model: {exc}") from None


def _check_no_window(metadata: Mapping[str, Any], where: str) -> None:
    """Refuse an ``olmo2`` file whose ``attention.sliding_window`` (llama.cpp's converter writes it when the
    checkpoint's config has one) is shorter than the context on a layer ``attention.sliding_window_pattern``
    marks: llama.cpp would attend through the window, kael attends to the whole context."""
    w = metadata.get("olmo2.attention.sliding_window")
    if w is None:
        return
    ctx = meta_int(metadata, "olmo2.context_length", where)
    pattern = metadata.get("olmo2.attention.sliding_window_pattern")
    sliding = True if not isinstance(pattern, (list, tuple)) else any(bool(p) for p in pattern)
    if type(w) is not int or (w < ctx and sliding):
        raise FormatError(
            f"{where}: metadata 'olmo2.attention.sliding_window' is {w!r}, shorter than the context {ctx} on "
            "sliding layers: sliding window attention is not supported"
        )


def _arch(config: LlamaConfig) -> str:
    return config.model_type if config.model_type in ARCHITECTURES else "llama"


def tensor_specs(config: LlamaConfig) -> list[TensorSpec]:
    """Every tensor of a GGUF file of ``config`` (the one ``save_gguf`` writes too)."""
    c, f, v = config.hidden_size, config.intermediate_size, config.vocab_size
    h, kv, d = config.num_attention_heads, config.kv_heads, config.dim
    permuted = _arch(config) in _LLAMA_LIKE  # NOTE [gguf rope rows]
    specs = [TensorSpec(_TABLE, "model.embed_tokens.weight", (v, c), ROLE_TABLE)]
    if config.rope_freq_factors is not None:
        specs.insert(0, TensorSpec(_ROPE_FREQS, "", (d // 2,), ROLE_FLOAT, constant=True))
    for i in range(config.num_hidden_layers):
        b, m = f"blk.{i}.", f"model.layers.{i}."
        attn = (
            ("attn_q", "self_attn.q_proj", h * d, c, h if permuted else 0, config.qkv_bias),
            ("attn_k", "self_attn.k_proj", kv * d, c, kv if permuted else 0, config.qkv_bias),
            ("attn_v", "self_attn.v_proj", kv * d, c, 0, config.qkv_bias),
            ("attn_output", "self_attn.o_proj", c, h * d, 0, config.o_bias),
            ("ffn_gate", "mlp.gate_proj", f, c, 0, config.mlp_bias),
            ("ffn_up", "mlp.up_proj", f, c, 0, config.mlp_bias),
            ("ffn_down", "mlp.down_proj", c, f, 0, config.mlp_bias),
        )
        if isinstance(config, Olmo2Config):  # post-norms, q/k norms over the whole projection
            specs.append(TensorSpec(f"{b}post_attention_norm.weight", f"{m}post_attention_layernorm.weight", (c,)))
            specs.append(TensorSpec(f"{b}post_ffw_norm.weight", f"{m}post_feedforward_layernorm.weight", (c,)))
            specs.append(TensorSpec(f"{b}attn_q_norm.weight", f"{m}self_attn.q_norm.weight", (h * d,)))
            specs.append(TensorSpec(f"{b}attn_k_norm.weight", f"{m}self_attn.k_norm.weight", (kv * d,)))
        else:
            specs.append(TensorSpec(f"{b}attn_norm.weight", f"{m}input_layernorm.weight", (c,)))
            specs.append(TensorSpec(f"{b}ffn_norm.weight", f"{m}post_attention_layernorm.weight", (c,)))
        if config.qk_norm:
            specs.append(TensorSpec(f"{b}attn_q_norm.weight", f"{m}self_attn.q_norm.weight", (d,)))
            specs.append(TensorSpec(f"{b}attn_k_norm.weight", f"{m}self_attn.k_norm.weight", (d,)))
        for gg, kael, out_f, in_f, rope, bias in attn:
            specs.append(
                TensorSpec(f"{b}{gg}.weight", f"{m}{kael}.weight", (out_f, in_f), ROLE_LINEAR, rope_heads=rope)
            )
            if bias:
                specs.append(TensorSpec(f"{b}{gg}.bias", f"{m}{kael}.bias", (out_f,), ROLE_FLOAT, rope_heads=rope))
    specs.append(TensorSpec("output_norm.weight", "model.norm.weight", (c,)))
    if not config.tie_word_embeddings:
        specs.append(TensorSpec(_HEAD, "lm_head.weight", (v, c), ROLE_LINEAR))
    return specs


def _freq_factors(tensors: Mapping[str, Any], dim: int, where: str) -> tuple[float, ...] | None:
    """The values of a ``rope_freqs.weight`` tensor (None without one); FormatError unless F32 [dim/2], positive."""
    t = tensors.get(_ROPE_FREQS)
    if t is None:
        return None
    if t.type != "F32" or tuple(t.shape) != (dim // 2,):
        raise FormatError(
            f"{where}: tensor {_ROPE_FREQS!r} must be F32 of shape [{dim // 2}] (head_dim / 2), "
            f"got {t.type} {list(t.shape)}"
        )
    values = np.asarray(t.data, dtype=np.float64)
    if not (np.isfinite(values).all() and (values > 0).all()):
        raise FormatError(f"{where}: tensor {_ROPE_FREQS!r} must hold finite positive factors")
    return tuple(float(x) for x in values)


def constant_tensor(model: LlamaForCausalLM, spec: TensorSpec) -> np.ndarray:
    """The data of a constant spec: ``rope_freqs.weight`` from the config's ``rope_freq_factors``."""
    factors = model.config.rope_freq_factors
    if spec.name != _ROPE_FREQS or factors is None:
        raise KaelError(f"save_gguf: {spec.name!r} is not a tensor this model's config holds")
    return np.asarray(factors, dtype=np.float32)


def export_specs(model: LlamaForCausalLM) -> list[TensorSpec]:
    return tensor_specs(model.config)


def new_model(config: LlamaConfig, device: Any) -> LlamaForCausalLM:
    classes: dict[type[LlamaConfig], type[LlamaForCausalLM]] = {
        Qwen3Config: Qwen3ForCausalLM,
        GraniteConfig: GraniteForCausalLM,
        SmolLM3Config: SmolLM3ForCausalLM,
        Olmo2Config: Olmo2ForCausalLM,
    }
    cls = classes.get(type(config), LlamaForCausalLM)
    return cls(config, device=device, init=False)


def check_extra(f: Any, where: str) -> None:
    """Nothing beyond the tensor specs (tying and biases were read from the tensors present)."""


def skip_tensor(spec: TensorSpec) -> bool:
    return False


def finish(model: LlamaForCausalLM, mmap: bool) -> None:
    """A float copy-mode load fuses q/k/v and gate/up as ``from_pretrained`` does (NOTE [fused projections])."""
    if mmap or model.weights_scheme is not None:
        return
    from .llama._checkpoint import fuse_projections

    fuse_projections(model)


def handles(model: Any) -> bool:
    # a family built on LlamaForCausalLM whose layout this module does not write (Qwen3-MoE's experts) has none
    return isinstance(model, LlamaForCausalLM) and model.config.model_type in (*ARCHITECTURES, "mistral")


def gguf_metadata(model: LlamaForCausalLM) -> tuple[str, dict[str, Any]]:
    c = model.config
    a = _arch(c)
    if any(c.layer_windows):
        raise KaelError(
            f"save_gguf: this model has sliding-window layers (windows {sorted(set(c.layer_windows) - {0})}), which "
            f"GGUF's {a!r} architecture cannot record (llama.cpp would attend to the whole context); save it with "
            "save_pretrained instead"
        )
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
        f"{a}.rope.freq_base": float(c.rope_theta),
    }
    if isinstance(c, GraniteConfig):
        out.update({f"{a}.{k}": float(getattr(c, f)) for k, f in _GRANITE_KEYS.items()})
    if isinstance(c, SmolLM3Config) and c.no_rope_layers != no_rope_layers(c.num_hidden_layers):
        raise KaelError(
            f"save_gguf: no_rope_layers {list(c.no_rope_layers or ())} is not llama.cpp's smollm3 pattern (no rope "
            "on every fourth layer), which a GGUF file cannot change"
        )
    kind = c.rope_scaling.rope_type
    if kind == "linear":
        out[f"{a}.rope.scaling.type"] = "linear"
        out[f"{a}.rope.scaling.factor"] = float(c.rope_scaling.get("factor"))
    elif kind not in ("default", "dynamic"):  # dynamic is the default inside the context (llama/_rope.py)
        raise KaelError(f"save_gguf: rope type {kind!r} cannot be written to GGUF by kael (default and linear can)")
    return a, out
