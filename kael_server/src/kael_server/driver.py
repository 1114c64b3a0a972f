"""The request flow shared by the generation routes, whatever their wire format.

read the body (capped) -> validate -> admit (429 at once if the slot is taken) -> wait for
the prompt to be encoded on the worker -> stream events, or wait for the whole text while
watching for a disconnect. A Reply object turns the results into one API's wire format.

A request with a constraint (``response_format``, ``tools``, ...) builds its Reply in a thread:
compiling a grammar (and, the first time, indexing the vocabulary for it) must not stall the
event loop's other requests. A server that would refuse it (every slot and queue place taken)
says 429 before that work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import msgspec
from litestar import Request, Response
from litestar.response import Stream

from kael_server import deadline, limits, sse
from kael_server.accounting import RequestRecord, outcome_of_error, record_of
from kael_server.errors import Busy, Cancelled, ClientGone, ServerError, client_error
from kael_server.generator import Generator
from kael_server.jobs import Finished, JobStats, Prompt, SamplingParams, TextPiece
from kael_server.state import ServerState
from kael_server.structured import has_constraint
from kael_server.validation import decode, read_body
from kael_server.waiting import accepted, finished

__all__ = ["Reply", "retry_headers", "serve_generation"]

B = TypeVar("B", bound=msgspec.Struct)


class Reply(Protocol):
    """How one API phrases a generation: built from the validated body of one request."""

    prompts: tuple[Prompt, ...]
    params: SamplingParams
    stream: bool

    def plain(self, done: Finished, stats: JobStats) -> Response[Any]: ...

    def piece(self, piece: TextPiece) -> bytes: ...

    def finish(self, stats: JobStats) -> list[bytes]: ...

    def stream_error(self, error: ServerError) -> bytes: ...


async def serve_generation(
    request: Request[Any, Any, Any],
    server: ServerState,
    schema: type[B],
    make_reply: Callable[[B, Generator], Reply],
    error_response: Callable[[ServerError], Response[Any]],
    body_limit: int = limits.MAX_BODY_BYTES,
) -> Response[Any]:
    record = record_of(request)
    try:
        body = decode(await read_body(request, body_limit), schema)
        generator = server.require()
        if has_constraint(body):
            if generator.scheduler.full():
                raise Busy
            reply = await asyncio.to_thread(make_reply, body, generator)
        else:
            reply = make_reply(body, generator)
        job = record.job = generator.submit(reply.prompts, reply.params, record.started)
        deadline.arm(job, server.request_timeout)
        if reply.stream:
            await accepted(job, request)
            events = sse.job_events(job, record, piece=reply.piece, finish=reply.finish, error=reply.stream_error)
            return Stream(events, media_type=sse.MEDIA_TYPE, headers=sse.HEADERS)
        done = await finished(job, request)
        record.outcome = "ok"
        return reply.plain(done, job.stats)
    except ClientGone:
        return _client_gone(record, error_response)
    except asyncio.CancelledError:  # the server gave up on this request: so does the model
        if record.job is not None:
            record.job.cancel("client")
        raise
    except Exception as exc:
        failure = client_error(exc, record.request_id)
        record.outcome = outcome_of_error(failure)
        return error_response(failure)


def _client_gone(record: RequestRecord, error_response: Callable[[ServerError], Response[Any]]) -> Response[Any]:
    """The client left: stop its generation; the 499 answer is for the log (nobody reads it)."""
    if record.job is not None:
        record.job.cancel("client")
    record.outcome = "cancelled"
    return error_response(Cancelled("client"))


def retry_headers(error: ServerError) -> dict[str, str] | None:
    return {"Retry-After": str(limits.RETRY_AFTER_SECONDS)} if error.status_code == 429 else None
