"""kael-server: an HTTP generation server for kael's models (completions and chat).

``kael-server --data DIR`` serves a checkpoint; in Python, ``create_app(Generator(model,
tokenizer))`` builds the Litestar app around any model and tokenizer of the right shape.

The public names are imported on first use (PEP 562): kael loads this package's
``kael.plugins`` entry point (``kael_server.plugin``) whenever it loads plugins, and that
must not cost the import of Litestar, uvicorn and structlog (about a second).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from kael_server.app import create_app
    from kael_server.batching import BatchScheduler
    from kael_server.cli import main
    from kael_server.config import ServerConfig
    from kael_server.generator import Generator
    from kael_server.loading import load_app
    from kael_server.metrics import Metrics
    from kael_server.scheduler import Scheduler

_WHERE = {
    "BatchScheduler": "kael_server.batching",
    "create_app": "kael_server.app",
    "main": "kael_server.cli",
    "Generator": "kael_server.generator",
    "load_app": "kael_server.loading",
    "Metrics": "kael_server.metrics",
    "Scheduler": "kael_server.scheduler",
    "ServerConfig": "kael_server.config",
}

__all__ = [
    "BatchScheduler",
    "Generator",
    "Metrics",
    "Scheduler",
    "ServerConfig",
    "__version__",
    "create_app",
    "load_app",
    "main",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'kael_server' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
