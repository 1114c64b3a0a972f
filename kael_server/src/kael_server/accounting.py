"""Per-request bookkeeping: request id, one log line, and the request metrics, for every outcome.

An ASGI middleware wraps each route, so a request is finished (counted, logged, taken out
of ``kael_requests_in_flight``) only when its last byte has been sent or the client has
gone, whether the answer was plain, streamed, refused or broken. Routes mark themselves as
generation routes with ``opt={"generation": True}``; only those are counted in the metrics.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, cast

import structlog
from litestar import Request
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from kael_server.errors import Cancelled, ServerError
from kael_server.jobs import Job
from kael_server.logs import get_logger
from kael_server.metrics import Metrics

__all__ = [
    "RequestAccounting",
    "RequestRecord",
    "outcome_of_error",
    "outcome_of_status",
    "record_of",
    "request_id_of",
]

_RECORD_KEY = "kael_record"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass
class RequestRecord:
    request_id: str
    started: float
    """``time.perf_counter()`` at arrival."""
    generation: bool
    status: int | None = None
    outcome: str | None = None
    """Set by a route when the status alone does not tell (a stream that failed or was cut)."""
    job: Job | None = None


def record_of(request: Request[Any, Any, Any]) -> RequestRecord:
    """The record RequestAccounting made for this request (every route runs inside it)."""
    return cast(RequestRecord, request.scope["state"][_RECORD_KEY])


def request_id_of(request: Request[Any, Any, Any]) -> str | None:
    """The request id, also for errors raised before RequestAccounting ran (routing, say)."""
    record = request.scope.get("state", {}).get(_RECORD_KEY)
    return record.request_id if isinstance(record, RequestRecord) else None


def outcome_of_status(status: int | None) -> str:
    if status == 504:  # only a generation past --request-timeout answers 504
        return "timeout"
    if status is None or status >= 500:
        return "error"
    if status == 429:
        return "busy"
    if status == 499:
        return "cancelled"
    if status >= 400:
        return "rejected"
    return "ok"


def outcome_of_error(error: ServerError) -> str:
    if isinstance(error, Cancelled):
        return "timeout" if error.reason == "timeout" else "cancelled"
    return outcome_of_status(error.status_code)


class RequestAccounting:
    """ASGI middleware: ``DefineMiddleware(RequestAccounting, metrics=...)``."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self.log = get_logger()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        record = RequestRecord(
            request_id=_request_id(scope),
            started=time.perf_counter(),
            generation=bool(scope["route_handler"].opt.get("generation")),
        )
        scope.setdefault("state", {})[_RECORD_KEY] = record

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", record.request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        if record.generation:
            self.metrics.in_flight.inc()
        try:
            with structlog.contextvars.bound_contextvars(request_id=record.request_id):
                await self.app(scope, receive, send_with_id)
        finally:
            self._finish(scope, record)

    def _finish(self, scope: Scope, record: RequestRecord) -> None:
        seconds = time.perf_counter() - record.started
        outcome = record.outcome or outcome_of_status(record.status)
        fields: dict[str, Any] = {}
        if record.generation:
            self.metrics.in_flight.dec()
            self.metrics.request_finished(outcome, seconds)
            fields["outcome"] = outcome
        if record.job is not None:
            stats = record.job.stats
            fields.update(
                prompt_tokens=stats.prompt_tokens,
                generated_tokens=stats.tokens,
                generation_seconds=round(stats.seconds, 4),
                ttft_seconds=None if stats.ttft is None else round(stats.ttft, 4),
            )
        self.log.info(
            "request",
            request_id=record.request_id,
            method=scope.get("method"),
            route=scope["path"],
            status=record.status,
            seconds=round(seconds, 4),
            **fields,
        )


def _request_id(scope: Scope) -> str:
    """The client's X-Request-ID when it is a short plain token, else a fresh one."""
    for name, value in scope.get("headers", []):
        if name == b"x-request-id":
            candidate = value.decode("latin-1")
            if _REQUEST_ID.fullmatch(candidate):
                return candidate
    return uuid.uuid4().hex
