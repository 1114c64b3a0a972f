"""OpenAI-compatible API: ``POST /v1/completions``, ``GET /v1/models`` and ``GET /v1/models/{id}``.

A request's ``model`` must be one of the names the model is served under (``--served-model-name``,
default its directory's name) or absent: another name is OpenAI's 404 ``model_not_found``.

``sampling_params`` turns the fields every OpenAI generation request shares
(``schemas.SamplingRequest``) into a job's SamplingParams, so a chat route reuses it.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, cast

from litestar import Request, Response, get, post

from kael_server import limits, sse
from kael_server.driver import retry_headers, serve_generation
from kael_server.errors import FieldError, InvalidRequest, PromptRejected, ServerError
from kael_server.generator import Generator
from kael_server.jobs import ChoiceStats, Finished, JobStats, Prompt, SamplingParams, TextPiece, TokenInfo
from kael_server.openapi import JSON, documented, sse_events
from kael_server.replies import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    Usage,
)
from kael_server.schemas import CompletionRequest, OpenAIError, OpenAIErrorResponse, SamplingRequest
from kael_server.state import ServerState
from kael_server.structured import constrained
from kael_server.validation import sampling_params_of

__all__ = [
    "CompletionReply",
    "ModelNotFound",
    "completions",
    "error_body",
    "error_response",
    "model",
    "models",
    "sampling_params",
    "served_model",
]

_ERRORS: dict[int, dict[str, Any]] = {
    status: {JSON: OpenAIErrorResponse} for status in (400, 404, 413, 429, 499, 500, 503)
}
_STARTED = int(time.time())
FinishReason = Literal["stop", "length"]


class ModelNotFound(ServerError):
    """A request names a model this server does not serve (404, OpenAI's ``model_not_found``)."""

    status_code = 404


def served_model(requested: str | None, generator: Generator) -> str:
    """The name an answer carries: the one requested, when it is served (None: the first served
    name); ModelNotFound otherwise (the message lists the served names, never the requested one)."""
    if requested is None:
        return generator.model_name
    if requested in generator.served_names:
        return requested
    raise ModelNotFound(
        f"the model named in the request is not served here; this server serves {', '.join(generator.served_names)} "
        "(GET /v1/models)"
    )


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def sampling_params(
    body: SamplingRequest, vocab_size: int, *, logprobs: int | None = None, echo: bool = False
) -> SamplingParams:
    """The job's SamplingParams from a validated request (null fields take their defaults);
    raises InvalidRequest for what the schema alone cannot say (rules between fields, token
    ids beyond the vocabulary)."""
    errors: list[FieldError] = []
    max_tokens = _or(body.max_tokens, 16)
    min_tokens = _or(body.min_tokens, 0)
    if max_tokens == 0 and not echo:
        errors.append(
            FieldError("max_tokens", f"expected an integer from 1 to {limits.MAX_NEW_TOKENS} (0 only with echo)")
        )
    if min_tokens > max_tokens:
        errors.append(FieldError("min_tokens", "expected at most max_tokens"))
    bias: tuple[tuple[int, float], ...] = ()
    if body.logit_bias:
        bias = tuple(sorted((int(token), float(value)) for token, value in body.logit_bias.items()))
        if bias[-1][0] >= vocab_size:
            errors.append(FieldError("logit_bias", f"expected token ids below the vocabulary size ({vocab_size})"))
    if errors:
        raise InvalidRequest(errors)
    top_k = _or(body.top_k, 0)
    return sampling_params_of(
        max_tokens=max_tokens,
        temperature=_or(body.temperature, 1.0),
        top_k=max(top_k, 0),  # -1 (vLLM) and 0 both mean all
        seed=body.seed,
        stop=body.stop_strings(),
        n=_or(body.n, 1),
        top_p=_or(body.top_p, 1.0),
        min_p=_or(body.min_p, 0.0),
        presence_penalty=_or(body.presence_penalty, 0.0),
        frequency_penalty=_or(body.frequency_penalty, 0.0),
        repetition_penalty=_or(body.repetition_penalty, 1.0),
        logit_bias=tuple((t, b) for t, b in bias if b != 0),
        min_tokens=min_tokens,
        ignore_eos=_or(body.ignore_eos, False),
        logprobs=logprobs,
        echo=echo,
    )


def _prompts(prompt: str | list[Any], vocab_size: int) -> tuple[Prompt, ...]:
    """The prompt field as a tuple of prompts (text, or token ids checked against the vocabulary)."""
    if isinstance(prompt, str):
        return (prompt,)
    if isinstance(prompt[0], str):
        return tuple(prompt)
    lists = [prompt] if isinstance(prompt[0], int) else prompt
    if any(i >= vocab_size for ids in lists for i in ids):
        raise InvalidRequest([FieldError("prompt", f"expected token ids below the vocabulary size ({vocab_size})")])
    return tuple(tuple(ids) for ids in lists)


class CompletionReply:
    def __init__(self, body: CompletionRequest, generator: Generator) -> None:
        echo = bool(body.echo)
        params = sampling_params(body, generator.vocab_size, logprobs=body.logprobs, echo=echo)
        self.model = served_model(body.model, generator)  # after the body's checks (400), before the compile
        self.params = constrained(params, body, generator)
        if body.best_of is not None and body.best_of != self.params.n:
            raise InvalidRequest([FieldError("best_of", "expected null or the value of n (every choice is returned)")])
        self.prompts = _prompts(body.prompt, generator.vocab_size)
        if len(self.prompts) * self.params.n > limits.MAX_CHOICES:
            raise InvalidRequest(
                [FieldError("n", f"expected n times the number of prompts to be at most {limits.MAX_CHOICES}")]
            )
        self.stream = bool(body.stream)
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _completion(self, choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def plain(self, done: Finished, stats: JobStats) -> Response[Any]:
        choices = [
            CompletionChoice(
                text=text,
                index=i,
                logprobs=_logprobs(choice.logprobs) if choice.logprobs is not None else None,
                finish_reason=_finish_reason(choice),
            )
            for i, (text, choice) in enumerate(zip(done.texts, stats.choices, strict=True))
        ]
        return Response(self._completion(choices, _usage(stats)))

    def piece(self, piece: TextPiece) -> bytes:
        logprobs = _logprobs(piece.logprobs) if self.params.logprobs is not None else None
        return sse.event(self._completion([CompletionChoice(text=piece.text, index=piece.index, logprobs=logprobs)]))

    def finish(self, stats: JobStats) -> list[bytes]:
        chunks = [
            sse.event(self._completion([CompletionChoice(text="", index=i, finish_reason=_finish_reason(choice))]))
            for i, choice in enumerate(stats.choices)
        ]
        if self.include_usage:
            chunks.append(sse.event(self._completion([], _usage(stats))))
        return chunks

    def stream_error(self, error: ServerError) -> bytes:
        return sse.event(error_body(error))


def _logprobs(tokens: list[TokenInfo] | tuple[TokenInfo, ...]) -> CompletionLogprobs:
    return CompletionLogprobs(
        tokens=[t.text for t in tokens],
        token_logprobs=[t.logprob for t in tokens],
        top_logprobs=[t.top for t in tokens],
        text_offset=[t.offset for t in tokens],
    )


def _finish_reason(choice: ChoiceStats) -> FinishReason:
    return cast(FinishReason, choice.finish_reason)


def _usage(stats: JobStats) -> Usage:
    """OpenAI's usage object of a finished job (``prompt_tokens_details.cached_tokens``: the prompt
    tokens the prefix cache served, as OpenAI reports its prompt caching)."""
    return Usage(
        prompt_tokens=stats.prompt_tokens,
        completion_tokens=stats.tokens,
        total_tokens=stats.prompt_tokens + stats.tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=stats.cached_tokens),
    )


def error_body(error: ServerError) -> OpenAIErrorResponse:
    status = error.status_code
    param = code = None
    if isinstance(error, InvalidRequest):
        message = "; ".join(f"{e.loc}: {e.msg}" for e in error.errors)
        param = next((e.loc for e in error.errors if e.loc != "body"), None)
    else:
        message = error.message
    if isinstance(error, PromptRejected) and status == 413:
        code = "context_length_exceeded"
    elif isinstance(error, ModelNotFound):
        code, param = "model_not_found", "model"
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
    return Response(error_body(error), status_code=status, headers=retry_headers(error))


@post(
    "/v1/completions",
    status_code=200,
    opt={"generation": True},
    operation_class=documented(
        {200: {JSON: Completion, sse.MEDIA_TYPE: sse_events(Completion, OpenAIErrorResponse)}, **_ERRORS},
        body=CompletionRequest,
    ),
    summary="OpenAI-compatible text completion",
    description=(
        "OpenAI's whole completion request, with vLLM's top_k, min_p, repetition_penalty, min_tokens "
        "and ignore_eos; fields outside the schema are ignored (and named in a log warning). Sampling "
        "order: logit_bias, repetition, frequency and presence penalties, then temperature, top_k, "
        "top_p, min_p. Choice i of prompt p has index p * n + i and, with a seed, samples with seed + i. "
        "logprobs are the model's own (before any penalty or bias)."
    ),
)
async def completions(request: Request[Any, Any, Any], server: ServerState) -> Response[Any]:
    return await serve_generation(
        request, server, CompletionRequest, CompletionReply, error_response, limits.MAX_OPENAI_BODY_BYTES
    )


def _cards(generator: Generator) -> list[ModelCard]:
    weights = generator.model.weights_scheme or "f32"
    return [
        ModelCard(
            id=name,
            created=_STARTED,
            max_model_len=generator.context_length,
            weights=weights,
            chat=generator.chat_template is not None,
        )
        for name in generator.served_names
    ]


@get(
    "/v1/models",
    operation_class=documented({200: {JSON: ModelList}, 503: {JSON: OpenAIErrorResponse}}),
    summary="The model this server serves (one card per served name), with its context length (max_model_len)",
)
async def models(server: ServerState) -> Response[Any]:
    try:
        generator = server.require()
    except ServerError as exc:
        return error_response(exc)
    return Response(ModelList(data=_cards(generator)))


@get(
    "/v1/models/{model_id:path}",
    operation_class=documented(
        {200: {JSON: ModelCard}, 404: {JSON: OpenAIErrorResponse}, 503: {JSON: OpenAIErrorResponse}}
    ),
    summary="One served model by name (OpenAI's retrieve); 404 model_not_found for a name not served",
)
async def model(model_id: str, server: ServerState) -> Response[Any]:
    try:
        generator = server.require()
        name = served_model(model_id.lstrip("/"), generator)
    except ServerError as exc:
        return error_response(exc)
    (card,) = [c for c in _cards(generator) if c.id == name]
    return Response(card)
