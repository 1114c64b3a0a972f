"""``Phi3DecodeStep``: ``LlamaDecodeStep`` over Phi-3's fused weights, with longrope's table rows.

Phi-3's checkpoint already holds q/k/v as one ``qkv_proj`` weight [(H + 2 Hkv) * D, C] and gate/up as one
``gate_up_proj`` [2F, C], in the row order the Llama step's fused buffers have (q, k, v; gate, up), so each
layer's ``qkv`` and ``gate_up`` are those weights (float or, after ``kael.quantize``, one QuantizedLinear's
blocks) and the step runs one product each, as it does for a Llama checkpoint fused on load. The step's
separate q/k/v and gate/up entries, which it reads only when ``qkv`` / ``gate_up`` is None, are the fused
weights too (never None here).

With longrope a token at position p reads the long half of the tables (row p + P) when p + 1 exceeds
``original_max_position_embeddings``: a one-token pass, NOTE [longrope factors] in ``_rope.py``. With a
partial rotary factor (``rotary_dim`` R < D) the ``rope`` kernel rotates the first R dims of each head (views of
the head buffers [n, H(kv), 1, R], the tables [2P or P, R/2]) and ``copy`` moves the other D - R, as the forward
pass's ``rope`` and ``cat`` do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import _dtype as dt
from ..._tensor import Tensor
from ...ops import arange
from ...ops._views import make_view
from .._steps import projection
from ..llama import LlamaDecodeStep
from ..llama._step import _Layer
from ._rope import table_offset

if TYPE_CHECKING:
    from .._paged_cache import PagedKVCache
    from ..llama import LlamaForCausalLM

__all__ = ["Phi3DecodeStep"]


class Phi3DecodeStep(LlamaDecodeStep):
    """One new token for each of a set of ``cache``'s rows of a ``Phi3ForCausalLM``."""

    def __init__(self, model: LlamaForCausalLM, cache: PagedKVCache, kernels: dict[str, Any]) -> None:
        super().__init__(model, cache, kernels)
        cfg: Any = model.config
        self.phi3_config, self.rot = cfg, int(cfg.rotary_dim)
        # the positions index both halves of longrope's tables: an arange over all their rows
        self.arange = arange(self.cos.shape[0], dtype=dt.int64, device=model.device)

    def read_layers(self, model: LlamaForCausalLM) -> list[_Layer]:
        """Each layer's fused weights (the separate entries are the fused ones too: never read here)."""
        out = []
        for blk in model.model.layers:
            a, m = blk.self_attn, blk.mlp
            qkv, gate_up = projection(a.qkv_proj), projection(m.gate_up_proj)
            o, down = projection(a.o_proj), projection(m.down_proj)
            in_norm, post_norm = blk.input_layernorm.weight, blk.post_attention_layernorm.weight
            # the separate entries are the fused weights too (read only when qkv / gate_up is None: never here)
            out.append(
                _Layer(
                    qkv,
                    gate_up,
                    in_norm,
                    qkv,
                    qkv,
                    qkv,
                    o,
                    post_norm,
                    gate_up,
                    gate_up,
                    down,
                    None,
                    None,
                    True,
                    a.window or 0,
                )
            )
        return out

    def rotate(self, out: Tensor, x: Tensor, where: Tensor) -> None:
        """rope on the first ``rotary_dim`` dims of each head of x [n, H(kv), 1, D] into ``out``, the rest copied."""
        r, d = self.rot, self.d
        if r == d:
            super().rotate(out, x, where)
            return
        self.k["rope"](_last(out, 0, r), _last(x, 0, r), self.cos, self.sin, where)
        self.k["copy"](_last(out, r, d - r), _last(x, r, d - r))

    def positions(self, pos: list[int]) -> Tensor:
        """The rows' table rows as int64 [n, 1]: each position, in longrope's long half past the original length."""
        return super().positions([p + table_offset(self.phi3_config, p, 1) for p in pos])


def _last(t: Tensor, start: int, n: int) -> Tensor:
    """Dims ``start .. start + n - 1`` of t's last dim, as a view."""
    return make_view(t, (*t.shape[:-1], n), t._strides, t._offset + start * t._strides[-1])
