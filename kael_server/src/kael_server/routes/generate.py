"""``POST /generate``: kael's own generation API, plain JSON or server-sent events."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post

from kael_server import sse
from kael_server.driver import retry_headers, serve_generation
from kael_server.errors import InvalidRequest, ServerError
from kael_server.generator import Generator
from kael_server.jobs import Finished, JobStats, Prompt, TextPiece
from kael_server.openapi import JSON, documented, sse_events
from kael_server.replies import GenerateResponse, StreamError, TextEvent
from kael_server.schemas import ErrorResponse, FieldErrorBody, GenerateRequest
from kael_server.state import ServerState
from kael_server.validation import sampling_params_of

__all__ = ["GenerateReply", "error_response", "generate"]

_ERRORS: dict[int, dict[str, Any]] = {status: {JSON: ErrorResponse} for status in (413, 422, 429, 499, 500, 503)}


class GenerateReply:
    def __init__(self, body: GenerateRequest, generator: Generator) -> None:
        self.prompts: tuple[Prompt, ...] = (body.prompt,)
        self.stream = body.stream
        self.params = sampling_params_of(
            max_tokens=body.max_tokens,
            temperature=body.temperature,
            top_k=body.top_k,
            seed=body.seed,
        )

    def plain(self, done: Finished, stats: JobStats) -> Response[Any]:
        return Response(GenerateResponse(text=done.text, tokens=stats.tokens, seconds=stats.seconds))

    def piece(self, piece: TextPiece) -> bytes:
        return sse.event(TextEvent(piece.text))

    def finish(self, stats: JobStats) -> list[bytes]:
        return []

    def stream_error(self, error: ServerError) -> bytes:
        return sse.event(StreamError(error.message))


def error_response(error: ServerError) -> Response[Any]:
    errors = None
    if isinstance(error, InvalidRequest):
        errors = [FieldErrorBody(e.loc, e.msg) for e in error.errors]
    return Response(
        ErrorResponse(detail=error.message, errors=errors),
        status_code=error.status_code,
        headers=retry_headers(error),
    )


@post(
    "/generate",
    status_code=200,
    opt={"generation": True},
    operation_class=documented(
        {200: {JSON: GenerateResponse, sse.MEDIA_TYPE: sse_events(TextEvent, StreamError)}, **_ERRORS},
        body=GenerateRequest,
    ),
    summary="Continue a prompt",
    description=(
        'With "stream": true the answer is server-sent events: data: {"text": ...} per decoded '
        'piece, then data: [DONE]; a failure is one data: {"error": ...} event before [DONE]. '
        "One generation runs at a time: a request meanwhile gets 429 with Retry-After."
    ),
)
async def generate(request: Request[Any, Any, Any], server: ServerState) -> Response[Any]:
    return await serve_generation(request, server, GenerateRequest, GenerateReply, error_response)
