"""``GraniteDecodeStep``: ``LlamaDecodeStep`` with Granite's multipliers, on the backend's primitive kernels.

The Llama step (``kael/models/llama/_step.py``) runs with its ``multipliers`` set: ``mul`` of the
embedding rows by ``embedding_multiplier``, of each o_proj and down_proj output by
``residual_multiplier`` before its residual ``add``, ``div`` of the logits by ``logits_scaling``,
and the attention kernels' softmax scale ``attention_multiplier``. The factors are 0-d tensors in
the model's dtype, broadcast by stride-0 views, so each kernel computes what the generic forward's
``mul(x, factor)`` / ``div(x, factor)`` computes (the same kernels on the same operands).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import _dispatch
from ...ops import tensor
from ..llama import LlamaDecodeStep, Multipliers

if TYPE_CHECKING:
    from .._paged_cache import PagedKVCache
    from ..llama import LlamaForCausalLM

__all__ = ["GraniteDecodeStep"]


class GraniteDecodeStep(LlamaDecodeStep):
    """One new token for each of a set of ``cache``'s rows of a ``GraniteForCausalLM``."""

    def __init__(self, model: LlamaForCausalLM, cache: PagedKVCache, kernels: dict[str, Any]) -> None:
        super().__init__(model, cache, kernels)
        cfg: Any = model.config
        dev, dtype = model.device, model.dtype
        self.k = {**kernels, "mul": _dispatch.kernel(dev.type, "mul"), "div": _dispatch.kernel(dev.type, "div")}

        def factor(v: float) -> Any:
            return tensor(float(v), dtype=dtype, device=dev)

        self.multipliers = Multipliers(
            factor(cfg.embedding_multiplier), factor(cfg.residual_multiplier), factor(cfg.logits_scaling)
        )
        self.scale = float(cfg.attention_multiplier)
