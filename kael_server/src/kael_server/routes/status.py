"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from litestar import Response, get

from kael_server.openapi import JSON, documented
from kael_server.schemas import HealthResponse
from kael_server.state import ServerState

_PROMETHEUS_TEXT = "text/plain"


@get(
    "/health",
    operation_class=documented({200: {JSON: HealthResponse}}),
    summary="Liveness: the server process answers",
)
async def health() -> HealthResponse:
    return HealthResponse("ok")


@get(
    "/ready",
    operation_class=documented({200: {JSON: HealthResponse}, 503: {JSON: HealthResponse}}),
    summary="Readiness: 503 while the model loads or the server drains",
)
async def ready(server: ServerState) -> Response[HealthResponse]:
    status = server.status
    return Response(HealthResponse(status), status_code=200 if status == "ready" else 503)


@get(
    "/metrics",
    operation_class=documented({200: {_PROMETHEUS_TEXT: {"type": "string"}}}),
    summary="Prometheus metrics (text exposition format)",
)
async def metrics(server: ServerState) -> Response[Any]:
    return Response(server.metrics.render(), media_type=server.metrics.content_type)
