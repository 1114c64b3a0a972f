"""``Qwen3MoeDecodeStep``: ``LlamaDecodeStep`` (Qwen3's attention) whose sparse layers run the experts' kernels.

The attention half of every layer, the dense layers' MLPs (``mlp_only_layers``, ``decoder_sparse_step``)
and the head are the Llama step's (``kael/models/llama/_step.py``, q/k norms on). A sparse layer's
MLP calls the backend's kernels on the normalised rows ``norm`` [n, 1, C], one row per sequence:

    linear(router)         route   [n, 1, E]   (the router's [E, C] weight; per row, as every projection)
    moe_route(k, renorm)   weights [n, k] float32 (float64 for float64), experts int64 [n, k]  (norm_topk_prob)
    expert_linear(gate_up) gu      [n, k, 2F]  (norm broadcast over the k slots: a stride-0 view)
    silu_mul               act     [n, k, F]   (of gu's gate and up halves, views)
    expert_linear(down)    y       [n, k, C]
    [copy: weights cast to the model's dtype, a 16-bit model]
    mul(y, weights)        y       [n, k, C]   (the weights broadcast over C: a stride-0 view)
    sum over k             proj    [n, 1, C]   then the Llama step's residual add

NOTE [moe step = forward]: these are the kernels, operands and shapes ``Qwen3MoeSparseMoeBlock.forward``
hands the backend for the same rows (its router product on the rows as [n, 1, C], its weighted sum
``mul`` then ``sum``, not a matmul, whose accumulation may round otherwise), so the step's logits are
the generic step's bit for bit. A row's own values never mix with another's except inside
``expert_linear``, which reads an expert's matrix once for all the rows routed to it (NOTE [expert
grouping] in ``kael/ops/_moe_fused.py``): batched rows equal rows alone bit for bit where that kernel
rounds a row the same way whatever the other rows of its group (the reference backend's: one product
per row), as the Llama step's ``linear`` must (NOTE [batched = alone] in ``kael/models/_batched.py``).

``create`` returns None (the generic step runs the model's forward) when the backend lacks a fused
op the step calls (``moe_route``, ``expert_linear`` and the Llama step's) or when a sparse layer's
experts are not stacked (NOTE [stacked experts] in ``_model.py``): a memory-mapped load, or quantized
experts (Q8_0/Q4_0: one ``QuantizedLinear`` per expert, no expert-grouped quantized kernel yet).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from ... import _dispatch
from ... import _dtype as dt
from ..._errors import KaelError
from ..._tensor import Tensor
from ...ops import empty
from ...ops._views import make_view
from .._decode_buffers import DecodeBuffers, View
from ..llama import LlamaDecodeStep
from ..llama._step import _FUSED, _Layer, _layer
from ._model import Qwen3MoeSparseMoeBlock

if TYPE_CHECKING:
    from .._paged_cache import PagedKVCache
    from ..llama import LlamaForCausalLM

__all__ = ["Qwen3MoeDecodeStep"]


class _Experts(NamedTuple):
    """A sparse layer's weights: the router [E, C] and the stacked experts [E, 2F, C] (gate; up) and [E, C, F]."""

    router: Tensor
    gate_up: Tensor
    down: Tensor


class _RowViews(NamedTuple):
    """The step's views of its first n rows that are not one buffer's per-row view (made once per n)."""

    experts: Tensor  # int64 [n, k]
    x: Tensor  # the normalised rows broadcast over the k slots [n, k, C] (strides C, 0, 1)
    weights: Tensor  # the routing weights in the model's dtype, broadcast over C [n, k, C] (strides k, 1, 0)


def _sparse_blocks(model: LlamaForCausalLM) -> list[Qwen3MoeSparseMoeBlock | None]:
    return [blk.mlp if isinstance(blk.mlp, Qwen3MoeSparseMoeBlock) else None for blk in model.model.layers]


class Qwen3MoeDecodeStep(LlamaDecodeStep):
    """One new token for each of a set of ``cache``'s rows of a ``Qwen3MoeForCausalLM``."""

    takes_positions = False  # its routing buffers have the batch's rows (NOTE [entries at positions])

    fused_ops = (*_FUSED, "moe_route", "expert_linear")

    def __init__(self, model: LlamaForCausalLM, cache: PagedKVCache, kernels: dict[str, Any]) -> None:
        super().__init__(model, cache, kernels)
        cfg: Any = model.config
        dev, dtype, c = model.device, model.dtype, self.c
        self.top_k, self.normalize = int(cfg.num_experts_per_tok), bool(cfg.norm_topk_prob)
        e, k, f = int(cfg.num_experts), self.top_k, int(cfg.moe_intermediate_size)
        self.k = {**kernels, "mul": _dispatch.kernel(dev.type, "mul"), "sum": _dispatch.kernel(dev.type, "sum")}
        self.experts: list[_Experts | None] = []
        for i, block in enumerate(_sparse_blocks(model)):
            stacks = block.stacks() if block is not None else None
            if block is not None and stacks is None:  # ``create`` gives None for such a model
                raise KaelError(f"Qwen3MoeDecodeStep: layer {i}'s experts are not stacked (NOTE [stacked experts])")
            self.experts.append(None if block is None or stacks is None else _Experts(block.gate.weight, *stacks))
        # The routing weights are float32 (float64 for a float64 model): a 16-bit model casts them to its dtype.
        self.cast_weights = dtype not in (dt.float32, dt.float64)
        self.moe_buf = DecodeBuffers(
            cache.batch,
            dtype,
            dev,
            {
                "route": (1, e),  # the router logits
                "weights": (k,),  # the routing weights (float32 / float64)
                "wcast": (k,),  # the same in the model's dtype (a 16-bit model)
                "gu": (k, 2 * f),  # each slot's expert gate/up product
                "act": (k, f),
                "y": (k, c),  # each slot's expert output, then weighted
            },
            stats=("weights",),
            views={
                "route2": View("route", (e,), (1,)),  # [n, E] as moe_route takes them
                "gu_gate": View("gu", (k, f), (2 * f, 1)),
                "gu_up": View("gu", (k, f), (2 * f, 1), f),
            },
        )
        self.expert_ids = empty((cache.batch, k), dtype=dt.int64, device=dev)
        self._row_views: dict[int, _RowViews] = {}

    @classmethod
    def create(cls, model: LlamaForCausalLM, cache: PagedKVCache) -> LlamaDecodeStep | None:
        """A step over ``cache``, or None when the backend lacks a fused kernel it calls or a sparse layer's experts
        are not stacked (a mapped load, quantized experts: NOTE [stacked experts] in ``_model.py``)."""
        if any(block is not None and block.stacks() is None for block in _sparse_blocks(model)):
            return None
        return super().create(model, cache)

    def read_layers(self, model: LlamaForCausalLM) -> list[_Layer]:
        """Each layer's weights, a sparse layer's MLP left out (its experts are ``self.experts``)."""
        return [
            _layer(blk, block is None) for blk, block in zip(model.model.layers, _sparse_blocks(model), strict=True)
        ]

    def _views(self, n: int, norm: Tensor) -> _RowViews:
        got = self._row_views.get(n)
        if got is None:
            ids, k, c = self.expert_ids, self.top_k, self.c
            w = self.moe_buf["wcast" if self.cast_weights else "weights"]
            got = _RowViews(
                make_view(ids, (n, k), ids._strides, ids._offset),
                make_view(norm, (n, k, c), (norm._strides[0], 0, norm._strides[2]), norm._offset),
                make_view(w, (n, k, c), (w._strides[0], w._strides[1], 0), w._offset),
            )
            self._row_views[n] = got
        return got

    def mlp(self, li: int, w: _Layer, v: dict[str, Tensor], n: int) -> None:
        """A sparse layer's experts on the normalised rows into ``v["proj"]`` (NOTE [moe step = forward]); a dense
        layer's SwiGLU as the Llama step's."""
        ex = self.experts[li]
        if ex is None:
            super().mlp(li, w, v, n)
            return
        k, m, r = self.k, self.moe_buf.views(n), self._views(n, v["norm"])
        k["linear"](m["route"], v["norm"], ex.router, None)
        k["moe_route"](m["weights"], r.experts, m["route2"], self.top_k, self.normalize)
        k["expert_linear"](m["gu"], r.x, ex.gate_up, r.experts)
        k["silu_mul"](m["act"], m["gu_gate"], m["gu_up"])
        k["expert_linear"](m["y"], m["act"], ex.down, r.experts)
        if self.cast_weights:
            k["copy"](m["wcast"], m["weights"])
        k["mul"](m["y"], m["y"], r.weights)
        k["sum"](v["proj"], m["y"], (1,))
