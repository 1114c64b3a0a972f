"""OpenAI-compatible API: ``POST /v1/completions`` and ``GET /v1/models``."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, cast

from litestar import Request, Response, get, post

from kael_server import sse
from kael_server.driver import retry_headers, serve_generation
from kael_server.errors import InvalidRequest, PromptRejected, ServerError
from kael_server.generator import Generator
from kael_server.jobs import JobStats, SamplingParams
from kael_server.openapi import JSON, documented, sse_events
from kael_server.schemas import (
    Completion,
    CompletionChoice,
    CompletionRequest,
    ModelCard,
    ModelList,
    OpenAIError,
    OpenAIErrorResponse,
    Usage,
)
from kael_server.state import ServerState

_ERRORS: dict[int, dict[str, Any]] = {status: {JSON: OpenAIErrorResponse} for status in (400, 413, 429, 499, 500, 503)}
_STARTED = int(time.time())
FinishReason = Literal["stop", "length"]


class CompletionReply:
    def __init__(self, body: CompletionRequest, generator: Generator) -> None:
        self.prompt = body.prompt
        self.stream = body.stream
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.params = SamplingParams(
            max_tokens=body.max_tokens,
            temperature=body.temperature,
            top_k=body.top_k,
            seed=body.seed,
            stop=body.stop_strings(),
        )
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = generator.model_name

    def _completion(self, choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def plain(self, text: str, stats: JobStats) -> Response[Any]:
        choice = CompletionChoice(text=text, finish_reason=_finish_reason(stats))
        return Response(self._completion([choice], _usage(stats)))

    def piece(self, text: str) -> bytes:
        return sse.event(self._completion([CompletionChoice(text=text)]))

    def finish(self, stats: JobStats) -> list[bytes]:
        last = self._completion([CompletionChoice(text="", finish_reason=_finish_reason(stats))])
        chunks = [sse.event(last)]
        if self.include_usage:
            chunks.append(sse.event(self._completion([], _usage(stats))))
        return chunks

    def stream_error(self, error: ServerError) -> bytes:
        return sse.event(_error_body(error))


def _finish_reason(stats: JobStats) -> FinishReason:
    return cast(FinishReason, stats.finish_reason)


def _usage(stats: JobStats) -> Usage:
    return Usage(
        prompt_tokens=stats.prompt_tokens,
        completion_tokens=stats.tokens,
        total_tokens=stats.prompt_tokens + stats.tokens,
    )


def _error_body(error: ServerError) -> OpenAIErrorResponse:
    status = error.status_code
    param = code = None
    if isinstance(error, InvalidRequest):
        message = "; ".join(f"{e.loc}: {e.msg}" for e in error.errors)
        param = next((e.loc for e in error.errors if e.loc != "body"), None)
    else:
        message = error.message
    if isinstance(error, PromptRejected) and status == 413:
        code = "context_length_exceeded"
    elif status == 429:
        code = "rate_limit_exceeded"
    if status == 429:
        kind = "rate_limit_error"
    elif status >= 500:
        kind = "server_error"
    else:
        kind = "invalid_request_error"
    return OpenAIErrorResponse(OpenAIError(message=message, type=kind, param=param, code=code))


def error_response(error: ServerError) -> Response[Any]:
    # OpenAI answers invalid parameters with 400, not 422.
    status = 400 if error.status_code == 422 else error.status_code
    return Response(_error_body(error), status_code=status, headers=retry_headers(error))


@post(
    "/v1/completions",
    status_code=200,
    opt={"generation": True},
    operation_class=documented(
        {200: {JSON: Completion, sse.MEDIA_TYPE: sse_events(Completion, OpenAIErrorResponse)}, **_ERRORS},
        body=CompletionRequest,
    ),
    summary="OpenAI-compatible text completion",
)
async def completions(request: Request[Any, Any, Any], server: ServerState) -> Response[Any]:
    return await serve_generation(request, server, CompletionRequest, CompletionReply, error_response)


@get(
    "/v1/models",
    operation_class=documented({200: {JSON: ModelList}, 503: {JSON: OpenAIErrorResponse}}),
    summary="The model this server serves",
)
async def models(server: ServerState) -> Response[Any]:
    try:
        generator = server.require()
    except ServerError as exc:
        return error_response(exc)
    card = ModelCard(id=generator.model_name, created=_STARTED, max_model_len=generator.context_length)
    return Response(ModelList(data=[card]))
