"""kael.optim: SGD, Adam, AdamW and learning-rate schedulers (``kael.optim.lr_scheduler``)."""

from __future__ import annotations

from . import lr_scheduler
from ._adam import Adam, AdamW
from ._optimizer import Optimizer
from ._sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]
