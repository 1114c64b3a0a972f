"""structlog configuration: one JSON object or one console line per event, written to stderr.

``kael-server`` calls ``configure_logging``; an application that embeds ``create_app`` keeps
its own structlog configuration (which should not render tracebacks with local variables).
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["console", "json"]


def configure_logging(log_format: LogFormat = "console", level: str = "info") -> None:
    """Sets structlog up for the whole process (structlog's configuration is global)."""
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
    structlog.configure(
        processors=[*shared, *renderer],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger() -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger("kael_server")  # type: ignore[no-any-return]
