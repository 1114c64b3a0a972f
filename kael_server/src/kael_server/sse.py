"""Server-sent events: framing, and the event stream of one generation job."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import msgspec

from kael_server.accounting import RequestRecord, outcome_of_error
from kael_server.errors import ServerError, client_error
from kael_server.jobs import Failed, Finished, Job, JobStats, TextPiece

__all__ = ["DONE", "HEADERS", "MEDIA_TYPE", "event", "job_events"]

MEDIA_TYPE = "text/event-stream"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = b"data: [DONE]\n\n"


def event(payload: msgspec.Struct) -> bytes:
    """One ``data:`` event; JSON never contains a raw newline, so one line always suffices."""
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


async def job_events(
    job: Job,
    record: RequestRecord,
    *,
    piece: Callable[[TextPiece], bytes],
    finish: Callable[[JobStats], list[bytes]],
    error: Callable[[ServerError], bytes],
) -> AsyncIterator[bytes]:
    """The events of ``job`` after its prompt was accepted, always closed by ``[DONE]``.

    If the iteration stops early (the client disconnected and the response task was
    cancelled), the job is cancelled so the model stops at its next token.
    """
    ended = False
    try:
        while True:
            item = await job.events.get()
            if isinstance(item, TextPiece):
                yield piece(item)
            elif isinstance(item, Finished):
                ended = True
                record.outcome = "ok"
                for chunk in finish(job.stats):
                    yield chunk
                yield DONE
                return
            elif isinstance(item, Failed):
                ended = True
                failure = client_error(item.error, record.request_id)
                record.outcome = outcome_of_error(failure)
                yield error(failure)
                yield DONE
                return
    finally:
        if not ended:
            job.cancel("client")
            record.outcome = "cancelled"
