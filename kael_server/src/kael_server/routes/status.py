"""Liveness, readiness and Prometheus metrics, for GET and HEAD.

``/health`` and ``/ready`` never need an API key (probes must not hold one); ``/metrics``
needs one only with ``--protect-metrics`` (kael_server.auth). A HEAD answer has the GET
answer's status, Content-Type and Content-Length, without the body.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Response, get, head

from kael_server.openapi import JSON, documented
from kael_server.replies import HealthResponse
from kael_server.state import ServerState

__all__ = ["STATUS_ROUTES", "health", "health_head", "metrics", "metrics_head", "ready", "ready_head"]

OPEN = {"auth": "open"}
METRICS = {"auth": "metrics"}
_HEAD_DOC = "Headers only, as for GET"


def _ready_status(server: ServerState) -> tuple[HealthResponse, int]:
    status = server.status
    return HealthResponse(status), 200 if status == "ready" else 503


def _metrics_headers(server: ServerState, body: bytes) -> dict[str, str]:
    # Set as a header, not a media type: Litestar would append a second "; charset=utf-8".
    return {"Content-Type": server.metrics.content_type, "Content-Length": str(len(body))}


def _head(body: bytes, status_code: int) -> Response[None]:
    return Response(None, status_code=status_code, headers={"Content-Type": JSON, "Content-Length": str(len(body))})


@get(
    "/health",
    opt=OPEN,
    operation_class=documented({200: {JSON: HealthResponse}}),
    summary="Liveness: the server process answers",
)
async def health() -> HealthResponse:
    return HealthResponse("ok")


@head("/health", opt=OPEN, operation_class=documented({200: {}}), summary=_HEAD_DOC)
async def health_head() -> Response[None]:
    return _head(msgspec.json.encode(HealthResponse("ok")), 200)


@get(
    "/ready",
    opt=OPEN,
    operation_class=documented({200: {JSON: HealthResponse}, 503: {JSON: HealthResponse}}),
    summary="Readiness: 503 while the model loads or the server drains",
)
async def ready(server: ServerState) -> Response[HealthResponse]:
    body, status_code = _ready_status(server)
    return Response(body, status_code=status_code)


@head("/ready", opt=OPEN, operation_class=documented({200: {}, 503: {}}), summary=_HEAD_DOC)
async def ready_head(server: ServerState) -> Response[None]:
    body, status_code = _ready_status(server)
    return _head(msgspec.json.encode(body), status_code)


_PROMETHEUS_TEXT = "text/plain"


@get(
    "/metrics",
    opt=METRICS,
    operation_class=documented({200: {_PROMETHEUS_TEXT: {"type": "string"}}}),
    summary="Prometheus metrics (text exposition format)",
)
async def metrics(server: ServerState) -> Response[Any]:
    body = server.metrics.render()
    return Response(body, headers=_metrics_headers(server, body))


@head("/metrics", opt=METRICS, operation_class=documented({200: {}}), summary=_HEAD_DOC)
async def metrics_head(server: ServerState) -> Response[None]:
    body = server.metrics.render()
    return Response(None, headers=_metrics_headers(server, body))


STATUS_ROUTES = [health, health_head, ready, ready_head, metrics, metrics_head]
