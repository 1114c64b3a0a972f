"""The request deadline (``--request-timeout S``): a timer on the event loop that cancels a job.

A generation still running ``S`` seconds after its request arrived is cancelled with reason
``"timeout"``; its scheduler stops it at the next token (or drops it from the queue) and frees
its slot, as for a client that left. The job then fails with ``Cancelled("timeout")``: a
plain request is answered 504, a stream ends with one error event and ``[DONE]``, and the
request is counted under the outcome ``timeout`` (``kael_requests_total{status="timeout"}``).
"""

from __future__ import annotations

import dataclasses
import math
import time

from litestar import Litestar
from litestar.openapi.spec import OpenAPIResponse

from kael_server.jobs import Job

__all__ = ["MAX_REQUEST_TIMEOUT", "arm", "check_request_timeout", "document_deadline"]

MAX_REQUEST_TIMEOUT = 86_400.0
"""A day: any longer is no limit worth having."""


def check_request_timeout(seconds: float | None) -> float | None:
    """``seconds`` if it is None (no limit) or a number of seconds in (0, one day]; ValueError otherwise."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or math.isnan(seconds):
        raise ValueError(f"the request timeout must be a number of seconds, got {seconds!r}")
    if not 0 < seconds <= MAX_REQUEST_TIMEOUT:
        raise ValueError(
            f"the request timeout must be more than 0 and at most {MAX_REQUEST_TIMEOUT:g} s, got {seconds!r}"
        )
    return float(seconds)


def arm(job: Job, seconds: float | None) -> None:
    """Cancels ``job`` with reason "timeout" ``seconds`` after its request arrived (no limit when
    None). Call on the event loop that owns the job; the timer goes once the job is done."""
    if seconds is None:
        return
    delay = max(0.0, job.arrived + seconds - time.perf_counter())
    timer = job.loop.call_later(delay, _expire, job)
    job.done.add_done_callback(lambda _: timer.cancel())


def _expire(job: Job) -> None:
    if not job.done.done():
        job.cancel("timeout")


def document_deadline(app: Litestar) -> None:
    """Adds the 504 answer to the OpenAPI document of every generation route (with the error
    body of the route's 500: each API phrases its errors its own way)."""
    generation = {
        route.path for route in app.routes for h in getattr(route, "route_handlers", ()) if h.opt.get("generation")
    }
    for path, item in (app.openapi_schema.paths or {}).items():
        operation = item.post if path in generation else None
        if operation is None or not operation.responses or "500" not in operation.responses:
            continue
        failure = operation.responses["500"]
        if isinstance(failure, OpenAPIResponse):
            timeout = dataclasses.replace(failure, description="The generation ran past --request-timeout")
            operation.responses = {**operation.responses, "504": timeout}
