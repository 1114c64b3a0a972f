"""kael.optim: SGD, Adam, AdamW, RMSprop, Adagrad and learning-rate schedulers (``kael.optim.lr_scheduler``)."""

from __future__ import annotations

from . import lr_scheduler
from ._adagrad import Adagrad
from ._adam import Adam, AdamW
from ._optimizer import Optimizer
from ._rmsprop import RMSprop
from ._sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "lr_scheduler"]
