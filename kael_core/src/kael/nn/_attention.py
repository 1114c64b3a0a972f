"""MultiheadAttention with PyTorch's arguments, masks, outputs and state_dict keys.

Parameters: ``in_proj_weight`` [3E, E] and ``in_proj_bias`` [3E] (or ``q_proj_weight``,
``k_proj_weight``, ``v_proj_weight`` when kdim/vdim differ from embed_dim) and
``out_proj`` (a Linear), and ``bias_k``/``bias_v`` [1, 1, E] with add_bias_kv, initialised as
PyTorch does, so a PyTorch checkpoint loads. add_zero_attn appends a zero key/value position.
"""

from __future__ import annotations

import math
from typing import Any

from .. import _dtype as dt
from .. import ops
from .._errors import DTypeError, ShapeError
from .._tensor import Tensor
from . import functional as F
from . import init
from ._layers import Linear
from ._module import Module
from ._parameter import Parameter

__all__ = ["MultiheadAttention"]


class MultiheadAttention(Module):
    """Attention of queries over keys/values with num_heads heads (Vaswani et al.), PyTorch's layout.

    Inputs are [L, N, E] (or [N, L, E] with batch_first, or unbatched [L, E]). ``attn_mask`` [L, S] or
    [N*num_heads, L, S] and ``key_padding_mask`` [N, S] are bool (True = may not attend) or float (added
    to the scores). Returns (output, weights): weights averaged over heads [N, L, S] (or per head with
    average_attn_weights=False), None with need_weights=False.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        for name, v in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ShapeError(f"MultiheadAttention: {name} must be a positive int, got {v!r}")
        if embed_dim % num_heads:
            raise ShapeError(f"MultiheadAttention: embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        d = dt.as_dtype(dtype) if dtype is not None else dt.get_default_dtype()
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.dropout, self.batch_first = float(dropout), bool(batch_first)
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(ops.empty(3 * embed_dim, embed_dim, dtype=d, device=device))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.register_parameter("in_proj_weight", None)
            self.q_proj_weight = Parameter(ops.empty(embed_dim, embed_dim, dtype=d, device=device))
            self.k_proj_weight = Parameter(ops.empty(embed_dim, self.kdim, dtype=d, device=device))
            self.v_proj_weight = Parameter(ops.empty(embed_dim, self.vdim, dtype=d, device=device))
        self.register_parameter(
            "in_proj_bias", Parameter(ops.empty(3 * embed_dim, dtype=d, device=device)) if bias else None
        )
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, device=device, dtype=d)
        if add_bias_kv:
            self.bias_k = Parameter(ops.empty(1, 1, embed_dim, dtype=d, device=device))
            self.bias_v = Parameter(ops.empty(1, 1, embed_dim, dtype=d, device=device))
        else:
            self.register_parameter("bias_k", None)
            self.register_parameter("bias_v", None)
        self.add_zero_attn = bool(add_zero_attn)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        if self.in_proj_weight is not None:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
            init.xavier_normal_(self.bias_v)

    def _project(self, x: Tensor, i: int) -> Tensor:
        e = self.embed_dim
        if self.in_proj_weight is not None:
            w = self.in_proj_weight[i * e : (i + 1) * e]
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[i]
        b = self.in_proj_bias[i * e : (i + 1) * e] if self.in_proj_bias is not None else None
        return F.linear(x, w, b)

    @staticmethod
    def _pad_keys(m: Tensor, extra: int) -> Tensor:
        """An additive mask [..., S] extended by ``extra`` key positions that every query may attend."""
        if not extra:
            return m
        return ops.cat([m, ops.zeros(*m.shape[:-1], extra, dtype=m.dtype, device=m.device)], -1)

    @staticmethod
    def _additive(mask: Tensor, dtype: dt.DType, name: str) -> Tensor:
        if mask.dtype is dt.bool_:
            return ops.where(mask, -math.inf, 0.0).to(dtype=dtype)  # type: ignore[no-any-return]
        if not mask.dtype.is_floating_point:
            raise DTypeError(f"MultiheadAttention: {name} must be bool or floating, got {mask.dtype!r}")
        return mask.to(dtype=dtype)  # type: ignore[no-any-return]

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """(attention output in the input's layout, attention weights or None)."""
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, Tensor) or t.ndim not in (2, 3):
                raise ShapeError(f"MultiheadAttention: {name} must be 2-d or 3-d, got {list(getattr(t, 'shape', ()))}")
        unbatched = query.ndim == 2
        if unbatched:
            query, key, value = (t.unsqueeze(0) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        n, tq, e = query.shape
        s = key.shape[1]
        if e != self.embed_dim or key.shape[0] != n or value.shape[:2] != (n, s):
            raise ShapeError(
                f"MultiheadAttention: query {list(query.shape)}, key {list(key.shape)} and value "
                f"{list(value.shape)} (batch first) do not fit embed_dim {self.embed_dim}"
            )
        h, hd = self.num_heads, self.head_dim
        kp, vp = self._project(key, 1), self._project(value, 2)
        extra = 0
        if self.bias_k is not None:  # one more key/value position: the learnt biases
            kp = ops.cat([kp, self.bias_k.expand(n, 1, e)], 1)
            vp = ops.cat([vp, self.bias_v.expand(n, 1, e)], 1)
            extra += 1
        if self.add_zero_attn:  # and one of zeros
            kp = ops.cat([kp, ops.zeros(n, 1, e, dtype=kp.dtype, device=kp.device)], 1)
            vp = ops.cat([vp, ops.zeros(n, 1, e, dtype=vp.dtype, device=vp.device)], 1)
            extra += 1
        q = self._project(query, 0).reshape(n, tq, h, hd).transpose(1, 2)
        k = kp.reshape(n, s + extra, h, hd).transpose(1, 2)
        v = vp.reshape(n, s + extra, h, hd).transpose(1, 2)
        scores = ops.mul(ops.matmul(q, k.transpose(-2, -1)), 1.0 / math.sqrt(hd))  # [N, H, L, S]
        if attn_mask is None and is_causal:
            attn_mask = ops.gt(ops.arange(s).unsqueeze(0), ops.arange(tq).unsqueeze(1)).to(device=query.device)
        if attn_mask is not None:
            m = self._additive(attn_mask, scores.dtype, "attn_mask")
            m = self._pad_keys(m, extra)
            if m.shape == (tq, s + extra):
                scores = ops.add(scores, m)
            elif m.shape == (n * h, tq, s + extra):
                scores = ops.add(scores, m.reshape(n, h, tq, s + extra))
            else:
                raise ShapeError(
                    f"MultiheadAttention: attn_mask must be [{tq}, {s}] or [{n * h}, {tq}, {s}], got {list(m.shape)}"
                )
        if key_padding_mask is not None:
            if key_padding_mask.shape != (n, s):
                raise ShapeError(
                    f"MultiheadAttention: key_padding_mask must be [{n}, {s}], got {list(key_padding_mask.shape)}"
                )
            m = self._pad_keys(self._additive(key_padding_mask, scores.dtype, "key_padding_mask"), extra)
            scores = ops.add(scores, m.reshape(n, 1, 1, s + extra))
        weights = ops.softmax(scores, -1)
        attn = F.dropout(weights, self.dropout, self.training) if self.dropout else weights
        out = ops.matmul(attn, v).transpose(1, 2).reshape(n, tq, e)
        out = self.out_proj(out)
        if unbatched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        w = ops.mean(weights, 1) if average_attn_weights else weights
        return out, (w.squeeze(0) if unbatched else w)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"
