"""kael-toy: a tiny causal-LM family (``model_type`` ``"kael_toy"``) for kael's plugin tests.

It uses kael's public API only, as an outside author would: a ``kael.models.CausalLMBase``
subclass supplying ``embed``, ``run_layer`` and ``run_head``, and a loader registered as
a ``kael.models.ModelFamily`` through the ``kael.models`` entry-point group (``plugin.py``).
"""

from __future__ import annotations

from ._model import ToyConfig, ToyLM, load, save

__all__ = ["ToyConfig", "ToyLM", "load", "save", "MODEL_TYPE"]

MODEL_TYPE = "kael_toy"
