"""structlog configuration: one JSON object or one console line per event, written to stderr.

``kael-server`` calls ``configure_logging``; an application that embeds ``create_app`` keeps
its own structlog configuration (which should not render tracebacks with local variables).
The standard library's logging (uvicorn's start-up, error and access lines, anything a
library logs) and Python's warnings go through the same renderer, so ``--log-format json``
makes every line of stderr a JSON object.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

__all__ = ["HANDLER_NAME", "LogFormat", "configure_logging", "get_logger"]

LogFormat = Literal["console", "json"]
HANDLER_NAME = "kael_server"
"""The name of the root-logger handler ``configure_logging`` installs (it replaces an earlier one)."""


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a line is logged (a test may swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.name = HANDLER_NAME

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def configure_logging(log_format: LogFormat = "console", level: str = "info") -> None:
    """Sets structlog and the standard library's root logger up for the whole process (both
    configurations are global)."""
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    # Tracebacks never show local variables: they would put prompts and generated text in the log.
    renderer: list[structlog.typing.Processor]
    if log_format == "json":
        tracebacks = structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
        renderer = [structlog.processors.ExceptionRenderer(tracebacks), structlog.processors.JSONRenderer()]
    else:
        console = structlog.dev.ConsoleRenderer(
            colors=sys.stderr.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
        renderer = [console]
    numeric_level = getattr(logging, level.upper())
    structlog.configure(
        processors=[*shared, *renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = _Stderr()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            # uvicorn's ``extra`` (a colored copy of the message) is left out on purpose.
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.name == HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric_level)
    logging.captureWarnings(True)  # a Python warning (a plugin that failed to load, say) is a log line too


def get_logger() -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger("kael_server")  # type: ignore[no-any-return]
