"""kael-server: an HTTP generation server for kael's GPT-2 models.

``kael-server --data DIR`` serves a checkpoint; in Python, ``create_app(Generator(model,
tokenizer))`` builds the Litestar app around any model and tokenizer of the right shape.
"""

from __future__ import annotations

__version__ = "0.1.0"

from kael_server.app import create_app
from kael_server.cli import main
from kael_server.generator import Generator
from kael_server.loading import load_app
from kael_server.metrics import Metrics
from kael_server.scheduler import Scheduler, SlotPool

__all__ = [
    "Generator",
    "Metrics",
    "Scheduler",
    "SlotPool",
    "__version__",
    "create_app",
    "load_app",
    "main",
]
