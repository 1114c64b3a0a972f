"""GPT-2: the model, its configuration, and its forward pass with an optional KV cache.

Parameters are named exactly as the checkpoint keys of the published GPT-2 files
(``wte.weight``, ``h.3.attn.c_attn.weight``, ``ln_f.bias``, ...), so loading is a
mapping, not a translation. Like Hugging Face's ``Conv1D``, the projections store
their weight as ``[in, out]``; the forward pass hands ``weight.T`` (an ``[out, in]``
view, no copy) to the fused ``linear`` op. The LM head is tied to ``wte``. There is
no dropout: kael's GPT-2 computes what the published model computes at inference.

One forward pass, shapes for batch B, T new tokens, C = dimension, H heads, D = C / H:

    x   = wte[ids] + wpe[positions]                       [B, T, C]
    per layer:
      qkv = linear(ln_1(x), c_attn)                         [B, T, 3, H, D] (a view)
      y   = attention(q, k, v, causal)  (k, v: new + cached) [B, H, T, D]
      x   = x + linear(y as [B, T, C], attn.c_proj)
      x   = x + linear(gelu_tanh(linear(ln_2(x), c_fc)), mlp.c_proj)
    logits = linear(ln_f(x), wte)                           [B, T, V]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from .. import _dtype as dt
from .._errors import AutogradError, DTypeError, ShapeError
from .._tensor import Tensor
from ..autograd import is_grad_enabled
from ..nn import LayerNorm, Module, ModuleList, Parameter, init
from ..ops import (
    add,
    attention,
    cat,
    embedding,
    empty,
    gelu,
    layer_norm,
    linear,
    narrow,
    permute,
    reshape,
    select,
    tensor,
    transpose,
    view,
)
from ._kv_cache import CacheStep, KVCache

__all__ = ["GPT", "GPTConfig", "Conv1D", "EmbeddingTable", "Block", "SelfAttention", "MLP"]


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a GPT-2 (defaults: GPT-2 small, 124M parameters)."""

    vocab_size: int = 50257
    max_positions: int = 1024
    layers: int = 12
    heads: int = 12
    dimension: int = 768
    layer_norm_epsilon: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_positions", "layers", "heads", "dimension"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ShapeError(f"GPTConfig: {name} must be a positive int, got {v!r}")
        if self.dimension % self.heads:
            raise ShapeError(f"GPTConfig: dimension {self.dimension} is not divisible by heads {self.heads}")
        eps = self.layer_norm_epsilon
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ShapeError(f"GPTConfig: layer_norm_epsilon must be a number in (0, 1), got {eps!r}")

    @property
    def head_dim(self) -> int:
        return self.dimension // self.heads

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _param(shape: tuple[int, ...], device: Any, dtype: dt.DType) -> Parameter:
    # Uninitialised: GPT.reset_parameters draws every value once (and from_pretrained never does).
    return Parameter(empty(shape, dtype=dtype, device=device))


class EmbeddingTable(Module):
    """A lookup table ``weight [num_embeddings, dim]`` (GPT-2's ``wte`` and ``wpe``)."""

    def __init__(self, num_embeddings: int, dim: int, device: Any = None, dtype: dt.DType = dt.float32) -> None:
        super().__init__()
        self.weight = _param((num_embeddings, dim), device, dtype)

    def forward(self, ids: Tensor) -> Tensor:
        return embedding(ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}"


class Conv1D(Module):
    """GPT-2's projection: ``x @ weight + bias`` with ``weight [in, out]`` (Hugging Face's Conv1D layout)."""

    def __init__(self, in_features: int, out_features: int, device: Any = None, dtype: dt.DType = dt.float32) -> None:
        super().__init__()
        self.weight = _param((in_features, out_features), device, dtype)
        self.bias = _param((out_features,), device, dtype)

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, transpose(self.weight, 0, 1), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.weight.shape[0]}, out_features={self.weight.shape[1]}"


class SelfAttention(Module):
    def __init__(self, dim: int, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        self.c_attn = Conv1D(dim, 3 * dim, device, dtype)
        self.c_proj = Conv1D(dim, dim, device, dtype)


class MLP(Module):
    def __init__(self, dim: int, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        self.c_fc = Conv1D(dim, 4 * dim, device, dtype)
        self.c_proj = Conv1D(4 * dim, dim, device, dtype)


class Block(Module):
    """One transformer layer: pre-norm attention and MLP, each added to the residual stream."""

    def __init__(self, config: GPTConfig, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        c, eps = config.dimension, config.layer_norm_epsilon
        self.ln_1 = LayerNorm(c, eps=eps, device=device, dtype=dtype)
        self.attn = SelfAttention(c, device, dtype)
        self.ln_2 = LayerNorm(c, eps=eps, device=device, dtype=dtype)
        self.mlp = MLP(c, device, dtype)


class LayerWeights(NamedTuple):
    """One layer's tensors as the forward pass consumes them (projections as [out, in] views)."""

    ln_1_w: Tensor
    ln_1_b: Tensor
    attn_w: Tensor
    attn_b: Tensor
    attn_proj_w: Tensor
    attn_proj_b: Tensor
    ln_2_w: Tensor
    ln_2_b: Tensor
    fc_w: Tensor
    fc_b: Tensor
    mlp_proj_w: Tensor
    mlp_proj_b: Tensor


def _t(w: Tensor) -> Tensor:
    return transpose(w, 0, 1)


class Plan(NamedTuple):
    """Every tensor of a forward pass, gathered once (generate reuses one plan for all its steps)."""

    layers: list[LayerWeights]
    wte: Tensor
    wpe: Tensor
    ln_f_w: Tensor
    ln_f_b: Tensor


class GPT(Module):
    """GPT-2 with a tied LM head: ``forward(ids [B, T], cache=None) -> logits [B, T, V]``.

    ``GPT()`` is GPT-2 small with GPT-2's random initialisation (``init=False`` leaves
    the parameters uninitialised, for loading). ``GPT.from_pretrained(directory)`` loads
    a Hugging Face style checkpoint; ``generate`` samples a continuation.
    """

    def __init__(
        self,
        vocab_size: int = 50257,
        max_positions: int = 1024,
        layers: int = 12,
        heads: int = 12,
        dimension: int = 768,
        layer_norm_epsilon: float = 1e-5,
        *,
        device: Any = None,
        dtype: Any = None,
        init: bool = True,
        generator: Any = None,
    ) -> None:
        super().__init__()
        cfg = GPTConfig(vocab_size, max_positions, layers, heads, dimension, layer_norm_epsilon)
        d = dt.as_dtype(dtype) if dtype is not None else dt.float32
        if not d.is_floating_point:
            raise DTypeError(f"GPT: dtype must be floating point, got {d!r}")
        self.config = cfg
        self.vocab_size = cfg.vocab_size
        self.max_positions = cfg.max_positions
        self.wte = EmbeddingTable(vocab_size, dimension, device, d)
        self.wpe = EmbeddingTable(max_positions, dimension, device, d)
        self.h = ModuleList([Block(cfg, device, d) for _ in range(layers)])
        self.ln_f = LayerNorm(dimension, eps=layer_norm_epsilon, device=device, dtype=d)
        if init:
            self.reset_parameters(generator)

    @classmethod
    def from_config(cls, config: GPTConfig, **kwargs: Any) -> GPT:
        return cls(**config.as_dict(), **kwargs)

    @classmethod
    def from_pretrained(cls, directory: Any, device: Any = "cpu", *, mmap: bool = False, dtype: Any = None) -> GPT:
        """Load ``config.json`` and ``model.safetensors`` from a directory (either key layout)."""
        from ._loading import from_pretrained

        return from_pretrained(directory, device=device, mmap=mmap, dtype=dtype)

    def save_pretrained(self, directory: Any) -> None:
        """Write ``config.json`` and ``model.safetensors`` that Hugging Face transformers and kael read."""
        from ._loading import save_pretrained

        save_pretrained(self, directory)

    def reset_parameters(self, generator: Any = None) -> None:
        """GPT-2's initialisation: N(0, 0.02) weights, residual projections scaled by 1/sqrt(2 * layers)."""
        std = 0.02
        for name, p in self.named_parameters():
            if (name.startswith("ln") or ".ln_" in name) and name.endswith("weight"):
                init.ones_(p)
            elif name.endswith("bias"):
                init.zeros_(p)
            else:
                s = std / math.sqrt(2 * self.config.layers) if name.endswith("c_proj.weight") else std
                init.normal_(p, 0.0, s, generator=generator)

    @property
    def device(self) -> Any:
        return self.wte.weight.device

    @property
    def dtype(self) -> dt.DType:
        return self.wte.weight.dtype

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"vocab_size={c.vocab_size}, max_positions={c.max_positions}, layers={c.layers}, heads={c.heads}, "
            f"dimension={c.dimension}"
        )

    # -- the forward pass --------------------------------------------------------------------
    def new_cache(self, batch: int = 1, max_positions: int | None = None) -> KVCache:
        """A KVCache for this model: ``batch`` rows of up to ``max_positions`` (default: the context)."""
        cfg = self.config
        n = cfg.max_positions if max_positions is None else max_positions
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= cfg.max_positions:
            raise ShapeError(f"new_cache: max_positions must be an int in 1..{cfg.max_positions}, got {n!r}")
        return KVCache(cfg.layers, batch, cfg.heads, cfg.head_dim, n, dtype=self.dtype, device=self.device)

    def plan(self) -> Plan:
        """The tensors of a forward pass, with each projection weight as an [out, in] view."""
        layers = []
        for blk in self.h:
            a, m = blk.attn, blk.mlp
            layers.append(
                LayerWeights(
                    blk.ln_1.weight,
                    blk.ln_1.bias,
                    _t(a.c_attn.weight),
                    a.c_attn.bias,
                    _t(a.c_proj.weight),
                    a.c_proj.bias,
                    blk.ln_2.weight,
                    blk.ln_2.bias,
                    _t(m.c_fc.weight),
                    m.c_fc.bias,
                    _t(m.c_proj.weight),
                    m.c_proj.bias,
                )
            )
        return Plan(layers, self.wte.weight, self.wpe.weight, self.ln_f.weight, self.ln_f.bias)

    def forward(
        self,
        ids: Tensor,
        cache: KVCache | None = None,
        lengths: Sequence[int] | None = None,
        *,
        last_only: bool = False,
    ) -> Tensor:
        """Logits [B, T, V] for token ids [B, T] (int).

        cache: a ``KVCache`` (``new_cache``): the tokens continue each row's cached ones, which
        they attend to, and their keys and values are added to it. lengths: for right-padded
        rows, how many of each row's T tokens are real (the cache advances by those). With
        ``last_only`` only each row's last real position is computed: logits [B, 1, V].
        """
        b, t, valid = self._check_forward(ids, cache, lengths, last_only)
        p = self.plan()
        step = cache.begin(t, valid) if cache is not None else None
        if step is None or step.uniform:
            start = 0 if step is None else step.starts[0]
            pos = narrow(p.wpe, 0, start, t)
        else:
            pos = embedding(tensor(step.positions, dtype=dt.int64, device=ids.device), p.wpe)
        x = add(embedding(ids, p.wte), pos)
        last = None if not last_only else [n - 1 for n in valid] if valid is not None else [t - 1] * b
        logits = self.run(x, p, step, last)
        if step is not None:
            step.commit()
        return logits

    def _check_forward(
        self, ids: Any, cache: KVCache | None, lengths: Sequence[int] | None, last_only: bool
    ) -> tuple[int, int, list[int] | None]:
        if not isinstance(ids, Tensor) or ids.dtype.category != 1:
            raise DTypeError(f"GPT.forward: ids must be an integer tensor, got {getattr(ids, 'dtype', type(ids))!r}")
        if ids.ndim != 2 or ids.shape[1] == 0 or ids.shape[0] == 0:
            raise ShapeError(
                f"GPT.forward: ids must have shape [batch, tokens] with both at least 1, got {list(ids.shape)}"
            )
        b, t = ids.shape
        valid = None
        if lengths is not None:
            valid = [int(n) for n in lengths] if not isinstance(lengths, Tensor) else [int(n) for n in lengths.tolist()]
            if len(valid) != b or any(not 0 <= n <= t for n in valid):
                raise ShapeError(
                    f"GPT.forward: lengths must give each of the {b} rows 0..{t} real tokens, got {list(lengths)!r}"
                )
            if last_only and min(valid) < 1:
                raise ShapeError(f"GPT.forward: last_only needs at least one real token per row, got {valid}")
        if cache is None:
            if t > self.max_positions:
                raise ShapeError(f"GPT.forward: {t} tokens exceed the context of {self.max_positions} positions")
            return b, t, valid
        if not isinstance(cache, KVCache):
            raise DTypeError(f"GPT.forward: cache must be a KVCache, got {type(cache).__name__}")
        cfg = self.config
        if (cache.layers, cache.heads, cache.head_dim) != (
            cfg.layers,
            cfg.heads,
            cfg.head_dim,
        ) or cache.max_positions > cfg.max_positions:
            raise ShapeError(
                f"GPT.forward: {cache!r} does not fit this model ({cfg.layers} layers, {cfg.heads} "
                f"heads of {cfg.head_dim}, context {cfg.max_positions}); use model.new_cache()"
            )
        if cache.batch != b:
            raise ShapeError(f"GPT.forward: the cache holds {cache.batch} rows but ids have {b}")
        if cache.device is not self.device or cache.dtype is not self.dtype:
            raise DTypeError(
                f"GPT.forward: the cache ({cache.dtype!r} on {cache.device}) must match the model "
                f"({self.dtype!r} on {self.device})"
            )
        if is_grad_enabled() and any(p.requires_grad for p in (self.wte.weight, self.ln_f.weight)):
            raise AutogradError(
                "GPT.forward: a KV cache is for inference (gradients do not flow through cached "
                "keys); run it under kael.no_grad() or kael.inference_mode()"
            )
        return b, t, valid

    def run(self, x: Tensor, p: Plan, step: CacheStep | None, last: list[int] | None = None) -> Tensor:
        """The layers, final norm and LM head on embedded tokens x [B, T, C] (see the module docstring).

        last: one position per row whose logits to compute (``[B, 1, V]``), or None for all.
        """
        for i in range(len(p.layers)):
            x = self.run_layer(i, x, p, step)
        if last is not None:
            x = (
                narrow(x, 1, last[0], 1)
                if all(n == last[0] for n in last)
                else cat([narrow(narrow(x, 0, r, 1), 1, n, 1) for r, n in enumerate(last)], 0)
            )
        return self.run_head(x, p)

    def run_layer(self, i: int, x: Tensor, p: Plan, step: CacheStep | None) -> Tensor:
        """Layer ``i`` of ``run`` on x [B, T, C] (its attention reads and extends ``step``'s cache)."""
        b, t, c = x.shape
        nh, hd = self.config.heads, self.config.head_dim
        eps = self.config.layer_norm_epsilon
        ns = (c,)
        w = p.layers[i]
        qkv = view(linear(layer_norm(x, ns, w.ln_1_w, w.ln_1_b, eps), w.attn_w, w.attn_b), b, t, 3, nh, hd)
        q = transpose(select(qkv, 2, 0), 1, 2)  # [B, H, T, D]
        if step is None:
            k = transpose(select(qkv, 2, 1), 1, 2)
            v = transpose(select(qkv, 2, 2), 1, 2)
            y = attention(q, k, v, causal=True)
        else:
            y = step.attend(i, q, permute(narrow(qkv, 2, 1, 2), 0, 2, 3, 1, 4))  # new k, v: [B, 2, H, T, D]
        x = add(x, linear(reshape(transpose(y, 1, 2), b, t, c), w.attn_proj_w, w.attn_proj_b))
        hid = gelu(linear(layer_norm(x, ns, w.ln_2_w, w.ln_2_b, eps), w.fc_w, w.fc_b), approximate="tanh")
        out: Tensor = add(x, linear(hid, w.mlp_proj_w, w.mlp_proj_b))
        return out

    def run_head(self, x: Tensor, p: Plan) -> Tensor:
        """The final layer norm and the LM head of ``run``: logits [B, T, V] for x [B, T, C]."""
        eps = self.config.layer_norm_epsilon
        return linear(layer_norm(x, (x.shape[-1],), p.ln_f_w, p.ln_f_b, eps), p.wte)

    # -- generation ----------------------------------------------------------------------------
    def generate(
        self,
        prompt: Any,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int = 0,
        on_token: Any = None,
        generator: Any = None,
        *,
        sampler: Any = None,
    ) -> list[int]:
        """New tokens continuing ``prompt`` (see ``kael.models.generate``)."""
        from ._generate import generate

        return generate(self, prompt, max_new_tokens, temperature, top_k, on_token, generator, sampler=sampler)
