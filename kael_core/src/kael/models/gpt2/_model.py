"""GPT-2: the model and its modules, each owning its forward pass.

Parameters are named exactly as the checkpoint keys of the published GPT-2 files
(``wte.weight``, ``h.3.attn.c_attn.weight``, ``ln_f.bias``, ...), so loading is a
mapping, not a translation. Like Hugging Face's ``Conv1D``, the projections store
their weight as ``[in, out]``; the forward pass hands ``weight.T`` (an ``[out, in]``
view, no copy) to the fused ``linear`` op. The LM head is tied to ``wte``. There is
no dropout: kael's GPT-2 computes what the published model computes at inference.

One forward pass, shapes for batch B, T new tokens, C = dimension, H heads, D = C / H:

    x   = wte[ids] + wpe[positions]                        [B, T, C]   GPT.embed
    per layer (Block.forward):
      qkv = attn.c_attn(ln_1(x))                           [B, T, 3, H, D] (a view)
      y   = attention(q, k, v, causal)  (k, v: new + cached) [B, H, T, D]
      x   = x + attn.c_proj(y as [B, T, C])
      x   = x + mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x))))
    logits = linear(ln_f(x), wte)                            [B, T, V]  GPT.run_head

``GPT`` is a ``CausalLM`` (NOTE [model-family seam] in ``kael/models/_protocol.py``):
``forward``, ``run`` and ``generate`` come from ``CausalLMBase``; its fast decode step
is ``GPT2DecodeStep`` (``_step.py``).

Every forward calls the child modules (``self.c_attn(x)``, ``self.wte(ids)``,
``self.wte.project(x)`` for the head), never their weights, so ``kael.quantize`` can swap
a ``Conv1D`` (``as_linear``) for a ``kael.quant.QuantizedLinear`` and ``quantize_embeddings``
``wte`` for a ``QuantizedTable`` (NOTE [weights choice] in ``kael/models/_weights.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ... import _dtype as dt
from ..._errors import DTypeError
from ..._tensor import Tensor
from ...nn import LayerNorm, Module, ModuleList, Parameter, init
from ...ops import (
    add,
    attention,
    embedding,
    empty,
    gelu,
    linear,
    narrow,
    permute,
    reshape,
    select,
    tensor,
    transpose,
    view,
)
from .._base import CausalLMBase
from .._paged_cache import PagedKVCache
from .._protocol import DecodeStep
from ._config import GPTConfig

__all__ = ["GPT", "Conv1D", "EmbeddingTable", "Block", "SelfAttention", "MLP"]


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

    def project(self, x: Tensor) -> Tensor:
        """The tied LM head over this table: x [.., C] -> logits [.., V]."""
        return linear(x, self.weight)

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

    def as_linear(self) -> tuple[Tensor, Tensor | None]:
        """(weight as [out, in], a view; bias): what ``kael.quantize`` turns into a ``QuantizedLinear``."""
        return transpose(self.weight, 0, 1), self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.weight.shape[0]}, out_features={self.weight.shape[1]}"


class SelfAttention(Module):
    """Causal multi-head self-attention: one fused q/k/v projection (``c_attn``), then ``c_proj``."""

    def __init__(self, dim: int, heads: int, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = Conv1D(dim, 3 * dim, device, dtype)
        self.c_proj = Conv1D(dim, dim, device, dtype)

    def forward(self, x: Tensor, step: Any = None, layer: int = 0) -> Tensor:
        """x [B, T, C] -> [B, T, C]; with a cache ``step``, the keys of layer ``layer`` are cached ones plus new."""
        b, t, c = x.shape
        nh = self.heads
        qkv = view(self.c_attn(x), b, t, 3, nh, c // nh)
        q = transpose(select(qkv, 2, 0), 1, 2)  # [B, H, T, D]
        if step is None:
            k = transpose(select(qkv, 2, 1), 1, 2)
            v = transpose(select(qkv, 2, 2), 1, 2)
            y = attention(q, k, v, causal=True)
        else:
            y = step.attend(layer, q, permute(narrow(qkv, 2, 1, 2), 0, 2, 3, 1, 4))  # new k, v: [B, 2, H, T, D]
        out: Tensor = self.c_proj(reshape(transpose(y, 1, 2), b, t, c))
        return out


class MLP(Module):
    """``c_proj(gelu_tanh(c_fc(x)))`` with a hidden width of 4 * dim."""

    def __init__(self, dim: int, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        self.c_fc = Conv1D(dim, 4 * dim, device, dtype)
        self.c_proj = Conv1D(4 * dim, dim, device, dtype)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.c_proj(gelu(self.c_fc(x), approximate="tanh"))
        return out


class Block(Module):
    """One transformer layer: pre-norm attention and MLP, each added to the residual stream."""

    def __init__(self, config: GPTConfig, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        c, eps = config.dimension, config.layer_norm_epsilon
        self.ln_1 = LayerNorm(c, eps=eps, device=device, dtype=dtype)
        self.attn = SelfAttention(c, config.heads, device, dtype)
        self.ln_2 = LayerNorm(c, eps=eps, device=device, dtype=dtype)
        self.mlp = MLP(c, device, dtype)

    def forward(self, x: Tensor, step: Any = None, layer: int = 0) -> Tensor:
        x = add(x, self.attn(self.ln_1(x), step, layer))
        out: Tensor = add(x, self.mlp(self.ln_2(x)))
        return out


class GPT(CausalLMBase):
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
        self.generation_config: Any = None  # a kael.models.GenerationConfig when loaded from a checkpoint
        self.weights_scheme: str | None = None  # kael.quantize's scheme of the weights; None: float
        self.wte: Module = EmbeddingTable(vocab_size, dimension, device, d)
        self.wpe = EmbeddingTable(max_positions, dimension, device, d)
        self.h = ModuleList([Block(cfg, device, d) for _ in range(layers)])
        self.ln_f = LayerNorm(dimension, eps=layer_norm_epsilon, device=device, dtype=d)
        if init:
            self.reset_parameters(generator)

    @classmethod
    def from_config(cls, config: GPTConfig, **kwargs: Any) -> GPT:
        """A GPT of ``config``'s shape; ``kwargs`` are the constructor's keywords (``device``, ``dtype``, ``init``,
        ``generator``)."""
        return cls(**config.as_dict(), **kwargs)

    @classmethod
    def from_pretrained(
        cls, directory: Any, device: Any = "cpu", *, mmap: bool = False, dtype: Any = None, weights: Any = None
    ) -> GPT:
        """Load ``config.json`` and ``model.safetensors`` from a directory (either key layout);
        ``weights`` as ``kael.models.from_pretrained``'s (NOTE [weights choice] in kael/models/_weights.py)."""
        from ._checkpoint import from_pretrained

        return from_pretrained(directory, device=device, mmap=mmap, dtype=dtype, weights=weights)

    def save_pretrained(self, directory: Any) -> None:
        """Write ``config.json`` and ``model.safetensors`` that Hugging Face transformers and kael read."""
        from ._checkpoint import save_pretrained

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
        """The ``kael.Device`` of the parameters (that of the token embedding ``wte``)."""
        return self.wte.weight.device

    @property
    def dtype(self) -> dt.DType:
        """The dtype the model computes in (its activations and KV cache): that of its norms."""
        d: dt.DType = self.ln_f.weight.dtype
        return d

    @property
    def num_layers(self) -> int:
        """The number of transformer blocks, ``config.layers`` (the length of ``h``)."""
        return self.config.layers

    @property
    def num_kv_heads(self) -> int:
        return self.config.heads

    @property
    def head_dim(self) -> int:
        """The size of one attention head, ``config.dimension // config.heads``."""
        return self.config.head_dim

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"vocab_size={c.vocab_size}, max_positions={c.max_positions}, layers={c.layers}, heads={c.heads}, "
            f"dimension={c.dimension}"
        )

    # -- the pieces of a forward pass (NOTE [model-family seam]) -------------------------------
    def embed(self, ids: Tensor, starts: Sequence[int]) -> Tensor:
        """Token plus position embeddings [B, T, C]; row b's tokens at positions starts[b]...starts[b]+T-1."""
        t = ids.shape[1]
        s0 = starts[0]
        if all(s == s0 for s in starts):
            pos = narrow(self.wpe.weight, 0, s0, t)
        else:
            where = tensor([list(range(s, s + t)) for s in starts], dtype=dt.int64, device=ids.device)
            pos = embedding(where, self.wpe.weight)
        out: Tensor = add(self.wte(ids), pos)
        return out

    def run_layer(self, i: int, x: Tensor, step: Any) -> Tensor:
        """Layer ``i`` on x [B, T, C] (its attention reads and extends ``step``'s cache)."""
        out: Tensor = self.h[i](x, step, i)
        return out

    def run_head(self, x: Tensor) -> Tensor:
        """The final layer norm and the tied LM head: logits [B, T, V] for x [B, T, C]."""
        out: Tensor = self.wte.project(self.ln_f(x))
        return out

    # -- weight formats (NOTE [weights choice] in kael/models/_weights.py) -----------------------
    def quantization_plan(self, weights: str) -> dict[str, str | None]:
        """The format of each projection and of the token table under ``weights``, as llama.cpp picks them
        (``kael.models.module_plan``; NOTE [quantization mixes])."""
        from .._weights_plan import module_plan

        return module_plan(self, weights)

    def quantize_embeddings(self, scheme: str) -> None:
        """``wte`` as a QuantizedTable in the head's format of ``quantization_plan(scheme)`` (it is the tied LM
        head too: Q6_K or Q8_0); ``wpe`` stays float."""
        from .._weights import QuantizedTable, replace_module

        table_scheme = self.quantization_plan(scheme).get("wte")
        if isinstance(self.wte, EmbeddingTable) and table_scheme is not None:
            replace_module(self, "wte", QuantizedTable.from_float(self.wte.weight, table_scheme))

    def decode_step(self, cache: PagedKVCache) -> DecodeStep | None:
        """The direct-kernel step (``GPT2DecodeStep``), or None when the backend lacks a fused kernel it calls."""
        from ._step import GPT2DecodeStep

        return GPT2DecodeStep.create(self, cache)
