"""Exceptions that carry a client-safe status and message; anything else is answered as a 500."""

from __future__ import annotations

from dataclasses import dataclass

from kael_server.logs import get_logger

__all__ = [
    "BodyTooLarge",
    "Busy",
    "Cancelled",
    "ChatRejected",
    "ClientGone",
    "FieldError",
    "InvalidRequest",
    "NotReady",
    "PromptRejected",
    "QueueTimeout",
    "ServerConfigError",
    "ServerError",
    "client_error",
]


class ServerConfigError(Exception):
    """The server cannot start as configured; the message says what to change (and never
    repeats a secret such as an API key)."""


class ServerError(Exception):
    """Base of the errors whose ``message`` is written by kael_server and safe to send to a client."""

    status_code = 500
    message = "generation failed"

    def __init__(self, message: str | None = None) -> None:
        if message is not None:
            self.message = message
        super().__init__(self.message)


class Busy(ServerError):
    """Every generation slot is taken; the client should retry shortly (429)."""

    status_code = 429
    message = "the server is busy with another generation; retry shortly"


class QueueTimeout(Busy):
    """A queued request waited ``--queue-timeout`` seconds without getting a slot (429)."""

    message = "no generation slot became free in time; retry shortly"


class NotReady(ServerError):
    """The model is still loading, or the server is shutting down (503)."""

    status_code = 503
    message = "the server is not ready"


class BodyTooLarge(ServerError):
    status_code = 413
    message = "request body too large"


class PromptRejected(ServerError):
    """The prompt's tokens are unusable: empty (422) or too long for the context (413)."""

    def __init__(self, status_code: int, message: str) -> None:
        self.status_code = status_code
        super().__init__(message)


class Cancelled(ServerError):
    """The generation was stopped: ``reason`` is "client" (disconnect, 499: logged only),
    "shutdown" (503) or "timeout" (it ran past ``--request-timeout``, 504)."""

    status_code = 499
    _ANSWERS = {
        "shutdown": (503, "server shutting down"),
        "timeout": (504, "the request ran past the server's time limit (--request-timeout)"),
    }

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.status_code, message = self._ANSWERS.get(reason, (499, "client disconnected"))
        super().__init__(message)


class ChatRejected(ServerError):
    """A chat request the model cannot format: it has no chat template, or the template refused
    the conversation (400, with the reason)."""

    status_code = 400


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


@dataclass(frozen=True)
class FieldError:
    """One validation problem: the field it concerns (a name from the schema, never input) and what was expected."""

    loc: str
    msg: str


class InvalidRequest(ServerError):
    status_code = 422
    message = "invalid request"

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__()


def client_error(exc: BaseException, request_id: str | None, message: str = "generation failed") -> ServerError:
    """What the client may be told about ``exc``: our own errors as they are, anything else as a
    bare 500 whose cause (text and traceback) goes to the server log only."""
    if isinstance(exc, ServerError):
        return exc
    get_logger().error(
        "internal_error",
        request_id=request_id,
        message=message,
        error_type=type(exc).__name__,
        exc_info=exc,
    )
    return ServerError(message)
