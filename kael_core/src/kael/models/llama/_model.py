"""The Llama family's model (llama, qwen2, mistral): ``LlamaForCausalLM`` and its modules.

Parameters are named exactly as the Hugging Face checkpoint keys
(``model.embed_tokens.weight``, ``model.layers.3.self_attn.k_proj.weight``,
``model.layers.3.mlp.gate_proj.weight``, ``model.norm.weight``, ``lm_head.weight`` unless
tied), with the projections ``[out, in]`` as ``nn.Linear`` stores them, so loading is a
mapping. One forward pass, shapes for batch B, T new tokens, C = hidden_size, H query
heads, Hkv key/value heads (H % Hkv == 0), D = head_dim, F = intermediate_size:

    x = embed_tokens[ids]                                        [B, T, C]    embed
    per layer (LlamaDecoderLayer.forward):
      h    = rms_norm(x, input_layernorm)
      q    = rope(q_proj(h) as [B, H, T, D]), k = rope(k_proj(h) as [B, Hkv, T, D])
             (qk_norm, Qwen3: q_norm/k_norm RMSNorm over D on each head before rope; no rope on
             a layer whose LlamaAttention.rope is off: SmolLM3's no_rope_layers)
      v    = v_proj(h) as [B, Hkv, T, D]
      y    = attention(q, k, v, causal)  (k, v: cached + new; query head h reads kv head h // (H/Hkv);
             softmax scale 1/sqrt(D), or LlamaAttention.scale: Granite's attention_multiplier)
      x    = x + o_proj(y as [B, T, H*D])
      x    = x + down_proj(silu_mul(gate_proj(h2), up_proj(h2)))  with h2 = rms_norm(x, post_attention_layernorm)
    logits = linear(rms_norm(x, norm), lm_head or embed_tokens)  [B, T, V]   run_head

Rotary positions are each row's own (``starts[b] + t``, NOTE [model-family seam]); the
cos/sin tables (``_rope.py``) are made once per device. The KV cache holds the Hkv
key/value heads only. ``LlamaForCausalLM`` is a ``CausalLM``: ``forward``, ``run`` and
``generate`` come from ``CausalLMBase``, its fast decode step is ``LlamaDecodeStep``.

Every forward calls the child modules, never their weights, so ``kael.quantize`` can swap
a ``Projection`` (``as_linear``) for a ``kael.quant.QuantizedLinear``; ``quantize_embeddings``
makes ``embed_tokens`` a ``QuantizedTable`` (and an untied float ``lm_head`` a
QuantizedLinear), ``on_quantized`` re-fuses q/k/v and gate/up (NOTE [weights choice] in
``kael/models/_weights.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ... import _dtype as dt
from ..._errors import DTypeError
from ..._tensor import Tensor
from ...nn import Module, ModuleList, Parameter, RMSNorm, init
from ...ops import (
    add,
    attention,
    cat,
    embedding,
    empty,
    linear,
    mul,
    reshape,
    rope,
    silu_mul,
    tensor,
    transpose,
    unsqueeze,
    view,
)
from .._base import CausalLMBase
from .._paged_cache import PagedKVCache
from .._protocol import DecodeStep
from ._config import LlamaConfig, hf_config, read_config
from ._layout import CheckpointLayout
from ._rope import rope_tables

__all__ = [
    "LlamaForCausalLM",
    "LlamaModel",
    "LlamaDecoderLayer",
    "LlamaAttention",
    "LlamaMLP",
    "Projection",
    "Table",
    "attend_and_project",
]


def _param(shape: tuple[int, ...], device: Any, dtype: dt.DType) -> Parameter:
    # Uninitialised: LlamaForCausalLM.reset_parameters draws every value once (from_pretrained never does).
    return Parameter(empty(shape, dtype=dtype, device=device))


class Projection(Module):
    """``x @ weight.T + bias`` with ``weight [out, in]`` (``nn.Linear``'s layout), bias optional, uninitialised."""

    def __init__(self, in_features: int, out_features: int, bias: bool, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        self.weight = _param((out_features, in_features), device, dtype)
        self.register_parameter("bias", _param((out_features,), device, dtype) if bias else None)

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)

    def as_linear(self) -> tuple[Tensor, Tensor | None]:
        """(weight [out, in], bias): what ``kael.quantize`` turns into a ``QuantizedLinear``."""
        return self.weight, self.bias

    def extra_repr(self) -> str:
        o, i = self.weight.shape
        return f"in_features={i}, out_features={o}, bias={self.bias is not None}"


class Table(Module):
    """A lookup table ``weight [num_embeddings, dim]`` (``embed_tokens``)."""

    def __init__(self, num_embeddings: int, dim: int, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        self.weight = _param((num_embeddings, dim), device, dtype)

    def forward(self, ids: Tensor) -> Tensor:
        return embedding(ids, self.weight)

    def project(self, x: Tensor) -> Tensor:
        """The tied LM head over this table: x [.., C] -> logits [.., V]."""
        return linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}"


class LlamaAttention(Module):
    """Grouped-query self-attention with rotary q and k (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``;
    with ``config.qk_norm``, per-head RMSNorms ``q_norm`` and ``k_norm`` [D] before rope)."""

    def __init__(self, config: LlamaConfig, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        c, h, kv, d = config.hidden_size, config.num_attention_heads, config.kv_heads, config.dim
        self.heads, self.kv_heads, self.head_dim = h, kv, d
        self.q_proj = Projection(c, h * d, config.qkv_bias, device, dtype)
        self.k_proj = Projection(c, kv * d, config.qkv_bias, device, dtype)
        self.v_proj = Projection(c, kv * d, config.qkv_bias, device, dtype)
        self.o_proj = Projection(h * d, c, config.o_bias, device, dtype)
        if config.qk_norm:  # Qwen3: each head of q and k RMS-normalised over D before rope
            self.q_norm = RMSNorm(d, eps=config.rms_norm_eps, device=device, dtype=dtype)
            self.k_norm = RMSNorm(d, eps=config.rms_norm_eps, device=device, dtype=dtype)
        self.qk_norm = config.qk_norm
        self.scale: float | None = None  # the softmax scale (None: 1/sqrt(D)); Granite's attention_multiplier
        self.rope = True  # rotary q and k; SmolLM3's no_rope_layers turn it off on some layers
        self.window: int | None = None  # a sliding-window layer's window (Gemma): keys p-window+1..p only

    def forward(self, x: Tensor, rot: tuple[Tensor, Tensor, Tensor], step: Any = None, layer: int = 0) -> Tensor:
        """x [B, T, C] -> [B, T, C]; rot = (cos, sin, positions [B, T]); ``step`` the cache step or None."""
        b, t, _ = x.shape
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        cos, sin, pos = rot
        q, k = view(self.q_proj(x), b, t, h, d), view(self.k_proj(x), b, t, kv, d)  # [B, T, H(kv), D]
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = transpose(q, 1, 2), transpose(k, 1, 2)  # [B, H, T, D], [B, Hkv, T, D]
        if self.rope:
            q, k = rope(q, cos, sin, pos), rope(k, cos, sin, pos)
        v = transpose(view(self.v_proj(x), b, t, kv, d), 1, 2)
        return attend_and_project(self, q, k, v, step, layer)


def attend_and_project(attn: Any, q: Tensor, k: Tensor, v: Tensor, step: Any, layer: int) -> Tensor:
    """``attn.o_proj`` of the causal attention of q [B, H, T, D] over k, v [B, Hkv, T, D] (after ``step``'s cached
    keys and values when it is given: ``layer``'s), at ``attn.scale`` (None: 1/sqrt(D)) within ``attn.window``
    (None: no window): [B, T, C]. The attention modules of the Llama-derived families share it."""
    b, h, t, d = q.shape
    if step is None:
        y = attention(q, k, v, causal=True, scale=attn.scale, window=attn.window)
    else:
        if attn.scale is not None:  # the cache step attends at 1/sqrt(D): the scale enters through q
            q = mul(q, attn.scale * math.sqrt(d))
        kv_new = cat([unsqueeze(k, 1), unsqueeze(v, 1)], 1)  # new k, v: [B, 2, Hkv, T, D]
        w = {} if attn.window is None else {"window": attn.window}  # a step of the older protocol takes none
        y = step.attend(layer, q, kv_new, **w)
    out: Tensor = attn.o_proj(reshape(transpose(y, 1, 2), b, t, h * d))
    return out


class LlamaMLP(Module):
    """SwiGLU: ``down_proj(silu(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, config: LlamaConfig, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        c, f, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = Projection(c, f, bias, device, dtype)
        self.up_proj = Projection(c, f, bias, device, dtype)
        self.down_proj = Projection(f, c, bias, device, dtype)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))
        return out


class LlamaDecoderLayer(Module):
    """One layer: pre-norm attention and MLP, each added to the residual stream.

    A family with its own attention or MLP module (Phi-3's fused projections) subclasses this with
    ``attention_class`` / ``mlp_class`` set (each built as ``cls(config, device, dtype)``).
    """

    attention_class: type[Any] = LlamaAttention
    mlp_class: type[Any] = LlamaMLP

    def __init__(self, config: LlamaConfig, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        c, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = self.attention_class(config, device, dtype)
        self.mlp = self.mlp_class(config, device, dtype)
        self.input_layernorm = RMSNorm(c, eps=eps, device=device, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(c, eps=eps, device=device, dtype=dtype)

    def forward(self, x: Tensor, rot: tuple[Tensor, Tensor, Tensor], step: Any = None, layer: int = 0) -> Tensor:
        x = add(x, self.self_attn(self.input_layernorm(x), rot, step, layer))
        out: Tensor = add(x, self.mlp(self.post_attention_layernorm(x)))
        return out


class LlamaModel(Module):
    """The decoder stack without the head: ``embed_tokens``, ``layers``, ``norm`` (checkpoint prefix ``model.``).

    ``layer_class``: the decoder layer each of ``layers`` is (a family's subclass of ``LlamaDecoderLayer``, or its
    own layer built as ``cls(config, device, dtype)``); ``norm_class``: the final norm (built as ``cls(hidden_size,
    eps=, device=, dtype=)``).
    """

    layer_class: type[Any] = LlamaDecoderLayer
    norm_class: type[Any] = RMSNorm

    def __init__(self, config: LlamaConfig, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        self.embed_tokens: Module = Table(config.vocab_size, config.hidden_size, device, dtype)
        self.layers = ModuleList([self.layer_class(config, device, dtype) for _ in range(config.num_hidden_layers)])
        self.norm = self.norm_class(config.hidden_size, eps=config.rms_norm_eps, device=device, dtype=dtype)


class LlamaForCausalLM(CausalLMBase):
    """A Llama-family causal LM: ``forward(ids [B, T], cache=None) -> logits [B, T, V]``.

    ``LlamaForCausalLM(config)`` draws transformers' initialisation (N(0,
    initializer_range) weights, zero biases, unit norms; ``init=False`` leaves the
    weights uninitialised, for loading). ``LlamaForCausalLM.from_pretrained(directory)``
    loads a Hugging Face llama/qwen2/mistral checkpoint.

    A family built on this class names the config it takes (``config_class``: another is refused) and, where its
    layers are not Llama's, the decoder stack it builds (``model_class``, built as ``cls(config, device, dtype)``).
    """

    config_class: type[LlamaConfig] = LlamaConfig
    model_class: type[Any] = LlamaModel
    #: ``rope_values(config, positions, numpy dtype) -> (cos, sin)``: the values of ``rope_tables`` (a family with
    #: its own rotary tables names its function: Phi-3's longrope).
    rope_values: Any = staticmethod(rope_tables)

    def __init__(
        self,
        config: LlamaConfig,
        *,
        device: Any = None,
        dtype: Any = None,
        init: bool = True,
        generator: Any = None,
        initializer_range: float = 0.02,
    ) -> None:
        super().__init__()
        want, name = self.config_class.__name__, type(self).__name__
        if not isinstance(config, self.config_class):
            a = "an" if want[0] in "AEIOU" else "a"
            raise DTypeError(f"{name}: config must be {a} {want}, got {type(config).__name__}")
        d = dt.as_dtype(dtype) if dtype is not None else dt.float32
        if not d.is_floating_point:
            raise DTypeError(f"{name}: dtype must be floating point, got {d!r}")
        self.config = config
        self.vocab_size = config.vocab_size
        self.max_positions = config.max_position_embeddings
        self.generation_config: Any = None  # a kael.models.GenerationConfig when loaded from a checkpoint
        self.weights_scheme: str | None = None  # kael.quantize's scheme of the weights; None: float
        self.model: LlamaModel = self.model_class(config, device, d)
        for layer, w in zip(self.model.layers, config.layer_windows):
            layer.self_attn.window = w or None  # NOTE [sliding window]: a window layer's keys p-w+1..p
        if not config.tie_word_embeddings:
            self.lm_head: Module = Projection(config.hidden_size, config.vocab_size, False, device, d)
        self._rot_tables: dict[tuple[Any, str], tuple[Tensor, Tensor]] = {}
        self._rot_positions: tuple[tuple[Any, tuple[int, ...], int], Tensor] | None = None
        if init:
            self.reset_parameters(generator, initializer_range)

    @classmethod
    def from_pretrained(
        cls, directory: Any, device: Any = "cpu", *, mmap: bool = False, dtype: Any = None, weights: Any = None
    ) -> LlamaForCausalLM:
        """Load ``config.json`` and the safetensors weights of a Hugging Face llama/qwen2/mistral directory;
        ``weights`` as ``kael.models.from_pretrained``'s (NOTE [weights choice] in kael/models/_weights.py)."""
        from ._checkpoint import from_pretrained

        return from_pretrained(directory, device=device, mmap=mmap, dtype=dtype, weights=weights, model_class=cls)

    @staticmethod
    def read_config(path: Any) -> LlamaConfig:
        """The config of a checkpoint's ``config.json`` (a family built on this class reads its own)."""
        return read_config(path)

    @staticmethod
    def checkpoint_layout(directory: Any) -> CheckpointLayout:
        """Where the checkpoint in ``directory`` keeps this model's tensors: under their own names (a family whose
        checkpoints hold the model inside a larger one says where, ``kael.models.llama.CheckpointLayout``)."""
        return CheckpointLayout()

    def hf_config(self) -> dict[str, Any]:
        """The ``config.json`` dictionary ``save_pretrained`` writes (``kael.models.llama.hf_config``)."""
        return hf_config(self.config, self.dtype.name)

    def save_pretrained(self, directory: Any) -> None:
        """Write ``config.json`` and ``model.safetensors`` that transformers and kael read."""
        from ._checkpoint import save_pretrained

        save_pretrained(self, directory)

    def reset_parameters(self, generator: Any = None, std: float = 0.02) -> None:
        """transformers' initialisation: N(0, std) projections and embeddings, zero biases, unit norm weights."""
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):  # input/post_attention_layernorm, q_norm, k_norm, model.norm
                init.ones_(p)
            elif name.endswith("bias"):
                init.zeros_(p)
            else:
                init.normal_(p, 0.0, std, generator=generator)

    @property
    def device(self) -> Any:
        """The ``kael.Device`` of the parameters (that of the token embedding ``model.embed_tokens``)."""
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> dt.DType:
        """The dtype the model computes in (its activations and KV cache): that of its norms."""
        d: dt.DType = self.model.norm.weight.dtype
        return d

    @property
    def num_layers(self) -> int:
        """The number of decoder layers, ``config.num_hidden_layers``."""
        return self.config.num_hidden_layers

    @property
    def num_kv_heads(self) -> int:
        return self.config.kv_heads

    @property
    def head_dim(self) -> int:
        """The size of one attention head: the config's ``head_dim``, else ``hidden_size // num_attention_heads``."""
        return self.config.dim

    @property
    def kv_window(self) -> int | None:
        """The longest of the layers' sliding windows when every layer has one (Mistral, Phi-3-mini-4k), else None
        (NOTE [sliding-window blocks] in kael/models/_paged_cache.py)."""
        windows = [layer.self_attn.window or 0 for layer in self.model.layers]
        return max(windows) if windows and min(windows) > 0 else None

    @property
    def lm_head_weight(self) -> Tensor:
        """The LM head's weight [V, C]: ``lm_head.weight``, or ``embed_tokens.weight`` when tied
        (in a weight format, the stored tensor: see ``head``)."""
        w: Tensor = self.head.weight
        return w

    @property
    def head(self) -> Module:
        """The module whose weight is the LM head: ``lm_head``, or ``model.embed_tokens`` when tied."""
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens
        return self.lm_head

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"model_type={c.model_type!r}, vocab_size={c.vocab_size}, hidden_size={c.hidden_size}, "
            f"layers={c.num_hidden_layers}, heads={c.num_attention_heads}, kv_heads={c.kv_heads}, "
            f"head_dim={c.dim}, tied={c.tie_word_embeddings}"
        )

    # -- rotary tables and positions -------------------------------------------------------------
    def rope_tables(self) -> tuple[Tensor, Tensor]:
        """The cos and sin tables [max_positions, head_dim / 2] (``rope_values``') on the model's device (float64
        for float64), made once per device and dtype."""
        dev = self.device
        wide = self.dtype is dt.float64
        key = (dev, "float64" if wide else "float32")
        got = self._rot_tables.get(key)
        if got is None:
            cos, sin = self.rope_values(self.config, self.max_positions, np.float64 if wide else np.float32)
            tdt = dt.float64 if wide else dt.float32
            got = (tensor(cos, dtype=tdt, device=dev), tensor(sin, dtype=tdt, device=dev))
            self._rot_tables = {key: got}
        return got

    def _positions(self, starts: Sequence[int], t: int) -> Tensor:
        """Positions int64 [B, T] of the step's tokens: row b's are starts[b] + 0..T-1 (the last one reused)."""
        key = (self.device, tuple(starts), t)
        last = self._rot_positions
        if last is not None and last[0] == key:
            return last[1]
        pos = tensor([list(range(s, s + t)) for s in starts], dtype=dt.int64, device=self.device)
        self._rot_positions = (key, pos)
        return pos

    # -- the pieces of a forward pass (NOTE [model-family seam]) -----------------------------------
    def embed(self, ids: Tensor, starts: Sequence[int]) -> Tensor:
        """The token embeddings [B, T, C] (positions enter through rotary q and k in each layer)."""
        out: Tensor = self.model.embed_tokens(ids)
        return out

    def run_layer(self, i: int, x: Tensor, step: Any) -> Tensor:
        """Layer ``i`` on x [B, T, C]; its attention reads and extends ``step``'s cache (None: no cache)."""
        starts = step.starts if step is not None else [0] * x.shape[0]
        cos, sin = self.rope_tables()
        out: Tensor = self.model.layers[i](x, (cos, sin, self._positions(starts, x.shape[1])), step, i)
        return out

    def run_head(self, x: Tensor) -> Tensor:
        """The final RMSNorm and the LM head: logits [B, T, V] for x [B, T, C]."""
        h = self.model.norm(x)
        out: Tensor = self.model.embed_tokens.project(h) if self.config.tie_word_embeddings else self.lm_head(h)
        return out

    # -- weight formats (NOTE [weights choice] in kael/models/_weights.py) -------------------------
    def quantization_plan(self, weights: str) -> dict[str, str | None]:
        """The format of each projection and of the token table under ``weights``, as llama.cpp picks them
        (``kael.models.module_plan``; NOTE [quantization mixes])."""
        from .._weights_plan import module_plan

        return module_plan(self, weights)

    def quantize_embeddings(self, scheme: str) -> None:
        """``embed_tokens`` as a QuantizedTable and an untied ``lm_head`` still float as a QuantizedLinear, in
        the formats ``quantization_plan(scheme)`` gives them (the head's, Q6_K or Q8_0, when tied)."""
        from ...quant import QuantizedLinear
        from .._weights import QuantizedTable, replace_module

        plan = self.quantization_plan(scheme)
        table_scheme = plan.get("model.embed_tokens")
        if isinstance(self.model.embed_tokens, Table) and table_scheme is not None:
            table = QuantizedTable.from_float(self.model.embed_tokens.weight, table_scheme)
            replace_module(self.model, "embed_tokens", table)
        head_scheme = plan.get("lm_head")
        if not self.config.tie_word_embeddings and isinstance(self.lm_head, Projection) and head_scheme is not None:
            head = QuantizedLinear.from_float(self.lm_head.weight, None, head_scheme)
            replace_module(self, "lm_head", head)

    def on_quantized(self) -> None:
        """Rebuild each layer's fused q/k/v and gate/up buffers over the new weights (NOTE [fused projections])."""
        from ._checkpoint import fuse_projections

        fuse_projections(self)

    def decode_step(self, cache: PagedKVCache) -> DecodeStep | None:
        """The direct-kernel step (``LlamaDecodeStep``), or None when the backend lacks a fused kernel it calls."""
        from ._step import LlamaDecodeStep

        return LlamaDecodeStep.create(self, cache)
