"""The mixture-of-experts fused ops: ``moe_route`` (top-k routing) and ``expert_linear`` (expert-grouped matmul).

As the other fused ops (``_fused``): each runs the backend's fused kernel when it has one and
its decomposition into primitives otherwise (registered in ``_fused.decompositions``, what the
conformance kit checks kernels against), and is differentiable through frontend ops.

    moe_route(logits [T, E], k, normalize) -> (weights [T, k], experts int64 [T, k])
        p       = softmax(logits) in float32 (float64 for float64 logits)
        experts = the k largest p of each row, largest first (ties: the lowest index first)
        weights = p[experts], divided by their sum when ``normalize``

    expert_linear(x [T, K, C] (or [T, C]), weight [E, N, C], experts int64 [T, K]) -> out [T, K, N]
        out[t, j] = weight[experts[t, j]] @ x[t, j]      (x [T, C]: x[t] for every j)

NOTE [expert grouping]: ``expert_linear`` sorts the T*K (token, slot) assignments by expert and
runs one product per expert over all the rows that chose it, so each expert's [N, C] weight is
read once per call, whatever the number of tokens (a sparse MoE layer's experts are most of a
model's bytes). The assignments are read on the host to form the groups (as transformers' loop
over the hit experts does).

The routing softmax is float32 for every logits dtype but float64 (transformers' router computes it
in float32 even for a float64 model, so float64 models differ from it by float32's rounding there).

NOTE [routing ties]: kael's ``topk`` (and so ``moe_route``) puts equal values in index order;
``torch.topk`` on CPU does not promise any order among ties (it returns ``[2, 4]`` for the top 2
of ``[1, 3, 3, 0, 3]``). Ties between float32 softmax probabilities of real router logits are
rare; where they happen the two frameworks may route a token to different (equally weighted)
experts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _dispatch
from .. import _dtype as dt
from .._errors import DTypeError, IndexError_, ShapeError
from .._tensor import Tensor
from ..autograd._function import Function
from ._core import cast, check_device, empty
from ._fused import decompositions, softmax_decomp
from ._indexing import _zeros, index_add_nograd
from ._linalg import _mm, _t
from ._pointwise import binary
from ._reduce import reduce_op
from ._topk_fused import topk_decomp
from ._views import _slice_fn, contiguous_nograd, expand, make_view, reshape_nograd

__all__ = ["moe_route", "expert_linear", "moe_route_decomp", "expert_linear_decomp", "ExpertLinear"]


def _route_dtype(d: dt.DType) -> dt.DType:
    """The dtype of the routing probabilities for logits of dtype d (float32, float64 for float64)."""
    return dt.float64 if d is dt.float64 else dt.float32


# -- decompositions (no autograd; primitives only) ------------------------------------------


def moe_route_decomp(logits: Tensor, k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """(weights, experts): softmax in float32/64, the top k (ties: lowest index first), renormalised if asked."""
    last = logits.ndim - 1
    p = softmax_decomp(cast(logits, _route_dtype(logits.dtype)), last)
    weights, experts = topk_decomp(p, k)
    if normalize and k:
        weights = binary("div", weights, reduce_op("sum", weights, (last,), True, weights.dtype))
    return weights, experts


def expert_groups(experts: Tensor) -> list[tuple[int, np.ndarray]]:
    """The assignments grouped by expert: (expert, flat positions int64 into experts' T*K entries), by expert."""
    flat = np.asarray(contiguous_nograd(experts)._host()).reshape(-1)  # any device: the host reads the ids
    if not flat.size:
        return []
    order = np.argsort(flat, kind="stable")
    ids, starts = np.unique(flat[order], return_index=True)
    ends = list(starts[1:]) + [len(flat)]
    return [(int(e), order[s:t].astype(np.int64)) for e, s, t in zip(ids, starts, ends, strict=True)]


def _index(positions: np.ndarray, device: Any) -> Tensor:
    """An int64 index tensor of ``positions`` on ``device``."""
    from ._creation import tensor

    return tensor(positions, dtype=dt.int64, device=device)


def _rows(x: Tensor, positions: np.ndarray, device: Any) -> Tensor:
    """x [T, K, C]'s rows at the flat (t * K + j) positions, as [n, C] (x a broadcast over K: its token rows)."""
    t, kk, c = x.shape
    if kk > 1 and x._strides[1] == 0:  # every slot of a token reads its one row: gather from the [T, C] view
        flat = make_view(x, (t, c), (x._strides[0], x._strides[2]), x._offset)
        positions = positions // kk
    else:
        flat = reshape_nograd(contiguous_nograd(x), (t * kk, c))
    idx = _index(positions, device)
    out = empty((len(positions), c), x.dtype, x.device)
    _dispatch.kernel(x.device.type, "index_select")(out, flat, idx, 0)
    return out


def _expert(weight: Tensor, e: int) -> Tensor:
    """weight [E, N, C]'s matrix e [N, C] (a view)."""
    v = _slice_fn(0, e, e + 1, 1)(weight)
    return make_view(v, weight.shape[1:], weight._strides[1:], v._offset)


def expert_linear_decomp(x: Tensor, weight: Tensor, experts: Tensor) -> Tensor:
    """out [T, K, N]: per expert hit, its rows of x gathered, one product with its weight, added into place."""
    t, kk, _ = x.shape
    n = weight.shape[1]
    out = _zeros((t * kk, n), x.dtype, x.device)
    for e, pos in expert_groups(experts):
        y = _mm(_rows(x, pos, x.device), _t(_expert(weight, e)))
        index_add_nograd(out, 0, _index(pos, x.device), y)
    return reshape_nograd(out, (t, kk, n))


decompositions["moe_route"] = moe_route_decomp
decompositions["expert_linear"] = expert_linear_decomp


# -- moe_route ------------------------------------------------------------------------------


def moe_route(logits: Tensor, k: int, normalize: bool = False) -> tuple[Tensor, Tensor]:
    """Top-k mixture-of-experts routing of router logits [T, E] (Qwen3-MoE's and Mixtral's router).

    Returns (weights [T, k] float32 (float64 for float64 logits), experts int64 [T, k]): the k
    largest softmax probabilities of each row, largest first (equal ones in index order, NOTE
    [routing ties]), divided by their sum when ``normalize`` (``norm_topk_prob``). Differentiable
    in the logits through the weights (the expert choice is not).
    """
    if not isinstance(logits, Tensor) or not logits.dtype.is_floating_point:
        raise DTypeError(f"moe_route: logits must be a floating-point tensor, got {getattr(logits, 'dtype', logits)!r}")
    if logits.ndim != 2:
        raise ShapeError(f"moe_route: logits must be [T, E], got shape {list(logits.shape)}")
    e = logits.shape[1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= e:
        raise ShapeError(f"moe_route: k={k!r} must be an int in [1, {e}] (the number of experts)")
    if not isinstance(normalize, bool):
        raise DTypeError(f"moe_route: normalize must be true or false, got {normalize!r}")
    kern = _dispatch.fused_kernel(logits.device.type, "moe_route")
    if kern is not None:
        weights = empty((logits.shape[0], k), _route_dtype(logits.dtype), logits.device)
        experts = empty((logits.shape[0], k), dt.int64, logits.device)
        if weights.numel():
            kern(weights, experts, logits, k, normalize)
    else:
        weights, experts = moe_route_decomp(logits, k, normalize)
    if logits.requires_grad:  # the weights again, through differentiable frontend ops
        from . import div, gather, softmax, sum, to

        weights = gather(softmax(to(logits, dtype=_route_dtype(logits.dtype)), -1), -1, experts)
        if normalize:
            weights = div(weights, sum(weights, -1, keepdim=True))
    return weights, experts


# -- expert_linear --------------------------------------------------------------------------


def _apply(x: Tensor, weight: Tensor, experts: Tensor) -> Tensor:
    kern = _dispatch.fused_kernel(x.device.type, "expert_linear")
    if kern is None:
        return expert_linear_decomp(x, weight, experts)
    out = empty(x.shape[:2] + (weight.shape[1],), x.dtype, x.device)
    if out.numel():
        kern(out, x, weight, experts)
    return out


class ExpertLinear(Function):
    """out[t, j] = W[e] @ x[t, j] with e = experts[t, j].

    Backward: dx[t, j] = W[e].T @ g[t, j] (``expert_linear`` with each matrix transposed, a view);
    dW[e] = sum over the rows that chose e of g[t, j] x[t, j].T (one product per expert hit).
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, experts: Tensor) -> Tensor:
        ctx.save_for_backward(x, weight, experts)
        return _apply(x, weight, experts)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        x, weight, experts = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx = dw = None
        if need[0]:
            e, n, c = weight.shape
            st = weight._strides
            wt = make_view(weight, (e, c, n), (st[0], st[2], st[1]), weight._offset)  # each matrix transposed
            dx = _apply(g, wt, experts)
        if need[1]:
            dw = _zeros(weight.shape, weight.dtype, weight.device)
            flat = reshape_nograd(dw, (weight.shape[0], weight.shape[1] * weight.shape[2]))
            for j, pos in expert_groups(experts):
                ge, xe = _rows(g, pos, g.device), _rows(x, pos, x.device)
                prod = reshape_nograd(_mm(_t(ge), xe), (1, weight.shape[1] * weight.shape[2]))
                index_add_nograd(flat, 0, _index(np.array([j], dtype=np.int64), g.device), prod)
        return dx, dw, None


def expert_linear(x: Tensor, weight: Tensor, experts: Tensor) -> Tensor:
    """Each token's rows through the experts it was routed to: out [T, K, N] (NOTE [expert grouping]).

    x [T, K, C] (row j of token t goes through expert experts[t, j]) or [T, C] (every slot of
    token t reads x[t]); weight [E, N, C], the experts' ``nn.Linear`` weights stacked; experts
    integer [T, K] with values in [0, E). x and weight share a floating dtype. Differentiable in
    x and weight.
    """
    for name, v in (("x", x), ("weight", weight)):
        if not isinstance(v, Tensor) or not v.dtype.is_floating_point:
            raise DTypeError(f"expert_linear: {name} must be a floating-point tensor, got {getattr(v, 'dtype', v)!r}")
    if not isinstance(experts, Tensor) or experts.dtype.category != 1:
        raise DTypeError(
            f"expert_linear: experts must be an integer tensor, got {getattr(experts, 'dtype', experts)!r}"
        )
    if weight.dtype is not x.dtype:
        raise DTypeError(f"expert_linear: x is {x.dtype!r} but weight is {weight.dtype!r}; expected the same dtype")
    if weight.ndim != 3:
        raise ShapeError(f"expert_linear: weight must be [E, N, C], got shape {list(weight.shape)}")
    if experts.ndim != 2:
        raise ShapeError(f"expert_linear: experts must be [T, K], got shape {list(experts.shape)}")
    t, kk = experts.shape
    c = weight.shape[2]
    if x.shape == (t, c):
        x = expand(_unsq(x), (t, kk, c))  # a stride-0 view: its backward sums the K slots' gradients
    elif x.shape != (t, kk, c):
        raise ShapeError(
            f"expert_linear: x {list(x.shape)} does not match experts {list(experts.shape)} and weight "
            f"{list(weight.shape)} (expected [T, K, C] = [{t}, {kk}, {c}] or [T, C] = [{t}, {c}])"
        )
    check_device("expert_linear", x, weight, experts)
    if experts.dtype is not dt.int64:
        experts = cast(experts, dt.int64)
    if experts.numel():
        every = (0, 1)
        lo = int(reduce_op("amin", experts, every, False, dt.int64).item())
        hi = int(reduce_op("amax", experts, every, False, dt.int64).item())
        if lo < 0 or hi >= weight.shape[0]:
            raise IndexError_(
                f"expert_linear: expert {lo if lo < 0 else hi} is out of range for {weight.shape[0]} experts "
                f"(expected 0 <= expert < {weight.shape[0]})"
            )
    return ExpertLinear.apply(x, weight, experts)  # type: ignore[no-any-return]


def _unsq(x: Tensor) -> Tensor:
    from ._views import unsqueeze

    out: Tensor = unsqueeze(x, 1)
    return out
