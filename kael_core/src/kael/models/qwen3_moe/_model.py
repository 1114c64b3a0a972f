"""``Qwen3MoeForCausalLM``: the Qwen3 model with sparse mixture-of-experts MLPs.

Parameters are named as Hugging Face's Qwen3-MoE checkpoint keys (transformers 5 saves its
fused [E, ...] expert tensors back as one matrix per expert): Qwen3's, and on a sparse layer
(``Qwen3MoeConfig.is_sparse``) in place of ``mlp.gate_proj/up_proj/down_proj``:

    model.layers.N.mlp.gate.weight                    [E, C]   the router
    model.layers.N.mlp.experts.J.gate_proj.weight     [F, C]   F = moe_intermediate_size
    model.layers.N.mlp.experts.J.up_proj.weight       [F, C]
    model.layers.N.mlp.experts.J.down_proj.weight     [C, F]

The sparse block on x [B, T, C], h = x as [B*T, C]:

    weights, experts = moe_route(h @ gate.T, k, norm_topk_prob)    [B*T, k] each (softmax in float32)
    y[t, j]  = down_e(silu(gate_e(h[t])) * up_e(h[t]))  with e = experts[t, j]          [B*T, k, C]
    out[t]   = sum_j weights[t, j] * y[t, j]    (weights rounded to x's dtype first, as transformers)

NOTE [stacked experts]: a copy-mode load (and ``fuse``, which ``from_pretrained`` and
``on_quantized`` run through the Llama loader's ``fuse_projections``) puts the experts' gate and
up weights into one [E, 2F, C] buffer and their down weights into one [E, C, F] buffer, each
expert's parameters being views of them (names, shapes and identities kept). Without autograd
the block then runs ``expert_linear`` twice over the buffers: each expert's weights read once
for all the tokens routed to it. Otherwise (gradients wanted, a mapped load, quantized experts)
it runs each hit expert's own modules on the rows routed to it: the same values, differentiable
in every parameter, and a ``kael.quantize``d expert's ``QuantizedLinear`` runs as it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ... import _dtype as dt
from ..._tensor import Tensor
from ...autograd import is_grad_enabled, no_grad
from ...nn import Module, ModuleList, Parameter
from ...nn._module import _set_data
from ...ops import (
    cat,
    empty,
    expert_linear,
    index_select,
    linear,
    moe_route,
    mul,
    narrow,
    reshape,
    select,
    silu_mul,
    tensor,
    to,
    unsqueeze,
)
from ...ops import sum as sum_
from ...ops._inplace import copy_
from ...ops._moe_fused import expert_groups
from .._paged_cache import PagedKVCache
from .._protocol import DecodeStep
from ..llama import LlamaConfig, LlamaForCausalLM
from ..llama._model import LlamaMLP, Projection
from ._config import Qwen3MoeConfig, qwen3_moe_hf_config, read_config

__all__ = ["Qwen3MoeForCausalLM", "Qwen3MoeSparseMoeBlock", "Qwen3MoeRouter"]


class Qwen3MoeRouter(Module):
    """The router ``weight [E, C]``: logits = x @ weight.T (no bias; not a ``Projection``, so ``kael.quantize``
    keeps it float, as llama.cpp keeps ``ffn_gate_inp``)."""

    def __init__(self, hidden: int, experts: int, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        self.weight = Parameter(empty((experts, hidden), dtype=dtype, device=device))

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight)

    def extra_repr(self) -> str:
        e, c = self.weight.shape
        return f"hidden={c}, experts={e}"


class Qwen3MoeSparseMoeBlock(Module):
    """The sparse MLP: ``gate`` (the router) and ``experts`` (E SwiGLU MLPs), NOTE [stacked experts]."""

    def __init__(self, config: Qwen3MoeConfig, device: Any, dtype: dt.DType) -> None:
        super().__init__()
        self.top_k, self.normalize = config.num_experts_per_tok, config.norm_topk_prob
        self.gate = Qwen3MoeRouter(config.hidden_size, config.num_experts, device, dtype)
        expert = dataclasses.replace(config, intermediate_size=config.moe_intermediate_size, mlp_bias=False)
        self.experts = ModuleList([LlamaMLP(expert, device, dtype) for _ in range(config.num_experts)])
        self._stacks: tuple[Tensor, Tensor, list[tuple[Tensor, Any, int]]] | None = None

    def extra_repr(self) -> str:
        return f"experts={len(self.experts)}, top_k={self.top_k}, norm_topk_prob={self.normalize}"

    def fuse(self) -> None:
        """Put the experts' weights into the [E, 2F, C] and [E, C, F] buffers (NOTE [stacked experts]); a no-op
        (the buffers dropped) unless every expert's three projections are float ``Projection``s of one dtype."""
        self._stacks = None
        mlps = list(self.experts)
        projs = [p for m in mlps for p in (m.gate_proj, m.up_proj, m.down_proj)]
        if not projs or any(type(p) is not Projection for p in projs):
            return
        if len({(p.weight.dtype, p.weight.device) for p in projs}) != 1:
            return
        w0 = mlps[0].gate_proj.weight
        e, (f, c) = len(mlps), w0.shape
        gate_up = empty((e, 2 * f, c), dtype=w0.dtype, device=w0.device)
        down = empty((e, c, f), dtype=w0.dtype, device=w0.device)
        records = []
        with no_grad():
            for j, m in enumerate(mlps):
                row = select(gate_up, 0, j)
                for block, p in ((narrow(row, 0, 0, f), m.gate_proj), (narrow(row, 0, f, f), m.up_proj)):
                    copy_(block, p.weight)
                    _set_data(p.weight, block)
                block = select(down, 0, j)
                copy_(block, m.down_proj.weight)
                _set_data(m.down_proj.weight, block)
                records += [
                    (p.weight, p.weight._storage, p.weight._offset) for p in (m.gate_proj, m.up_proj, m.down_proj)
                ]
        self._stacks = (gate_up, down, records)

    def _stacked(self) -> tuple[Tensor, Tensor] | None:
        """The buffers, when the experts' parameters are still views of them and no gradient is wanted."""
        if is_grad_enabled() and self.gate.weight.requires_grad:
            return None
        return self.stacks()

    def stacks(self) -> tuple[Tensor, Tensor] | None:
        """The [E, 2F, C] and [E, C, F] buffers while the experts' parameters are still float views of them
        (NOTE [stacked experts]), else None (never stacked, a mapped load, quantized or replaced experts)."""
        s = self._stacks
        if s is None:
            return None
        gate_up, down, records = s
        mlps = list(self.experts)
        if any(type(p) is not Projection for m in mlps for p in (m.gate_proj, m.up_proj, m.down_proj)):
            return None
        if any(w._storage is not st or w._offset != off for w, st, off in records):
            return None
        return gate_up, down

    def forward(self, x: Tensor) -> Tensor:
        """x [B, T, C] -> [B, T, C]."""
        b, t, c = x.shape
        h = reshape(x, b * t, c)
        # the router on x [B, T, C]: a decode step's rows [n, 1, C] are n one-row products (NOTE [batched = alone]),
        # as in Qwen3MoeDecodeStep (NOTE [moe step = forward] in _step.py)
        weights, experts = moe_route(reshape(self.gate(x), b * t, -1), self.top_k, self.normalize)
        stacks = self._stacked()
        if stacks is not None:
            gate_up, down = stacks
            f = down.shape[2]
            gu = expert_linear(h, gate_up, experts)  # [B*T, k, 2F]
            y = expert_linear(silu_mul(narrow(gu, 2, 0, f), narrow(gu, 2, f, f)), down, experts)
        else:
            y = self._by_expert(h, experts)
        w = to(weights, dtype=x.dtype)
        out: Tensor = reshape(sum_(mul(y, unsqueeze(w, 2)), 1), b, t, c)
        return out

    def _by_expert(self, h: Tensor, experts: Tensor) -> Tensor:
        """y [N, k, C]: each hit expert's modules on the rows routed to it, put back in (token, slot) order."""
        n, k = experts.shape
        parts, order = [], []
        for e, pos in expert_groups(experts):
            rows = index_select(h, 0, tensor(pos // k, dtype=dt.int64, device=h.device))
            parts.append(self.experts[e](rows))
            order.append(pos)
        if not parts:
            return empty((n, k, h.shape[1]), dtype=h.dtype, device=h.device)
        back = np.empty(n * k, dtype=np.int64)
        back[np.concatenate(order)] = np.arange(n * k)  # position in the grouped rows of each (token, slot)
        grouped = cat(parts, 0) if len(parts) > 1 else parts[0]
        out: Tensor = reshape(index_select(grouped, 0, tensor(back, dtype=dt.int64, device=h.device)), n, k, -1)
        return out


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    """A Qwen3-MoE causal LM: ``forward(ids [B, T], cache=None) -> logits [B, T, V]``.

    ``Qwen3MoeForCausalLM(config)`` draws transformers' initialisation (N(0, 0.02) router and experts);
    ``from_pretrained(directory)`` loads a Hugging Face qwen3_moe checkpoint (safetensors, sharded or not,
    float32/bfloat16/float16). Its ``decode_step`` is ``Qwen3MoeDecodeStep`` (``_step.py``) where the backend has
    the kernels and the experts are stacked, else None (generation runs this forward with the paged cache).
    """

    config: Qwen3MoeConfig
    config_class = Qwen3MoeConfig

    def __init__(self, config: LlamaConfig, *, init: bool = True, **kwargs: Any) -> None:
        generator, std = kwargs.pop("generator", None), kwargs.pop("initializer_range", 0.02)
        super().__init__(config, init=False, **kwargs)
        d = self.model.norm.weight.dtype
        for i, layer in enumerate(self.model.layers):
            if self.config.is_sparse(i):
                layer.mlp = Qwen3MoeSparseMoeBlock(self.config, self.model.norm.weight.device, d)
        if init:
            self.reset_parameters(generator, std)
            self.fuse_experts()

    def fuse_experts(self) -> None:
        """Stack each sparse layer's expert weights (NOTE [stacked experts])."""
        for layer in self.model.layers:
            if isinstance(layer.mlp, Qwen3MoeSparseMoeBlock):
                layer.mlp.fuse()

    @staticmethod
    def read_config(path: Any) -> Qwen3MoeConfig:
        """The Qwen3MoeConfig of a checkpoint's ``config.json``."""
        return read_config(path)

    def hf_config(self) -> dict[str, Any]:
        """The qwen3_moe ``config.json`` dictionary ``save_pretrained`` writes."""
        return qwen3_moe_hf_config(self.config, self.dtype.name)

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"{super().extra_repr()}, experts={c.num_experts}, top_k={c.num_experts_per_tok}, "
            f"moe_intermediate_size={c.moe_intermediate_size}, norm_topk_prob={c.norm_topk_prob}"
        )

    def quantization_plan(self, weights: str) -> dict[str, str | None]:
        """The format ``llama-quantize`` gives each projection (each expert's: its stack's), the token table and
        the head of this model's qwen3moe GGUF file (``kael.models._gguf_qwen3moe.plan``); the router stays float."""
        from .._gguf_qwen3moe import plan

        return plan(self.config, weights)

    def decode_step(self, cache: PagedKVCache) -> DecodeStep | None:
        """The direct-kernel step (``Qwen3MoeDecodeStep``), or None (``GenericStep`` runs the forward) when the backend
        lacks a fused kernel it calls or a sparse layer's experts are not stacked (a mapped load, quantized experts)."""
        from ._step import Qwen3MoeDecodeStep

        return Qwen3MoeDecodeStep.create(self, cache)
