"""``POST /v1/chat/completions``: OpenAI's chat API over the model's chat template.

The conversation is rendered by the template (with the generation prompt) and encoded as a
chat prompt; every sampling field, the admission, queueing, limits and deadline are those of
``/v1/completions`` (``sampling_params``, ``serve_generation``). A reply ends at the model's
end-of-text ids and at the template's end-of-turn tokens.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any, Literal, cast

import msgspec
from litestar import Request, Response, post

from kael_server import limits, sse
from kael_server.chat import conversation, render_chat
from kael_server.chat_schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatLogprobs,
    ChatMessage,
    ChatTokenLogprob,
    ChatTopLogprob,
)
from kael_server.driver import serve_generation
from kael_server.errors import FieldError, InvalidRequest, ServerError
from kael_server.generator import Generator
from kael_server.jobs import ChatPrompt, ChoiceStats, Finished, JobStats, Prompt, TextPiece, TokenInfo
from kael_server.openapi import JSON, documented, sse_events
from kael_server.routes.openai import _usage, error_body, error_response, sampling_params
from kael_server.schemas import OpenAIErrorResponse, Usage
from kael_server.state import ServerState

__all__ = ["ChatReply", "chat_completions", "token_bytes"]

_ERRORS: dict[int, dict[str, Any]] = {status: {JSON: OpenAIErrorResponse} for status in (400, 413, 429, 499, 500, 503)}
FinishReason = Literal["stop", "length"]


class ChatReply:
    """One chat request: its rendered prompt, its SamplingParams and its wire format."""

    def __init__(self, body: ChatCompletionRequest, generator: Generator) -> None:
        messages = conversation(body.messages)
        zero = [name for name in ("max_completion_tokens", "max_tokens") if getattr(body, name) == 0]
        if zero:  # /v1/completions takes 0 with echo; a chat reply has at least one token
            raise InvalidRequest([FieldError(name, f"expected 1 to {limits.MAX_NEW_TOKENS}") for name in zero])
        if body.top_logprobs is not None and not body.logprobs:
            raise InvalidRequest([FieldError("top_logprobs", "expected null unless logprobs is true")])
        given = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        sized = msgspec.structs.replace(body, max_tokens=given if given is not None else limits.MAX_NEW_TOKENS)
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        params = sampling_params(sized, generator.vocab_size, logprobs=logprobs)
        self.params = dataclasses.replace(params, stop_token_ids=generator.chat_stop_tokens, fit_context=given is None)
        self.prompts: tuple[Prompt, ...] = (
            ChatPrompt(render_chat(generator.chat_template, messages, generator.model_name)),
        )
        self.stream = bool(body.stream)
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = generator.model_name
        self._started: set[int] = set()
        """Choices whose first event (the role delta) was sent."""

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> bytes:
        chunk = ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)
        return sse.event(chunk)

    def _start(self, index: int) -> bytes:
        """The choice's first event, ``{"role": "assistant", "content": ""}``, unless it was sent."""
        if index in self._started:
            return b""
        self._started.add(index)
        return self._chunk([ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content=""))])

    def plain(self, done: Finished, stats: JobStats) -> Response[Any]:
        choices = [
            ChatChoice(
                index=i,
                message=ChatMessage(content=text),
                finish_reason=_finish_reason(choice),
                logprobs=self._logprobs(choice.logprobs) if choice.logprobs is not None else None,
            )
            for i, (text, choice) in enumerate(zip(done.texts, stats.choices, strict=True))
        ]
        completion = ChatCompletion(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=_usage(stats)
        )
        return Response(completion)

    def piece(self, piece: TextPiece) -> bytes:
        logprobs = self._logprobs(piece.logprobs) if self.params.logprobs is not None else None
        delta = ChatDelta(content=piece.text)
        return self._start(piece.index) + self._chunk(
            [ChatChunkChoice(index=piece.index, delta=delta, logprobs=logprobs)]
        )

    def finish(self, stats: JobStats) -> list[bytes]:
        chunks = []
        for i, choice in enumerate(stats.choices):
            ending = ChatChunkChoice(index=i, delta=ChatDelta(), finish_reason=_finish_reason(choice))
            chunks.append(self._start(i) + self._chunk([ending]))
        if self.include_usage:
            chunks.append(self._chunk([], _usage(stats)))
        return chunks

    def stream_error(self, error: ServerError) -> bytes:
        return sse.event(error_body(error))

    def _logprobs(self, tokens: list[TokenInfo] | tuple[TokenInfo, ...]) -> ChatLogprobs:
        top = self.params.logprobs or 0
        return ChatLogprobs(content=[_token_logprob(t, top) for t in tokens if t.logprob is not None])


def token_bytes(name: str) -> list[int]:
    """The UTF-8 bytes of a token named as ``output.token_text`` names it (its text, or
    ``bytes:\\xNN...`` for part of a character)."""
    if name.startswith("bytes:\\x"):
        return [int(h, 16) for h in name[len("bytes:") :].split("\\x")[1:]]
    return list(name.encode("utf-8"))


def _token_logprob(token: TokenInfo, top: int) -> ChatTokenLogprob:
    assert token.logprob is not None
    ranked = sorted((token.top or {}).items(), key=lambda item: -item[1])[:top]
    return ChatTokenLogprob(
        token=token.text,
        logprob=token.logprob,
        bytes=token_bytes(token.text),
        top_logprobs=[ChatTopLogprob(token=t, logprob=lp, bytes=token_bytes(t)) for t, lp in ranked],
    )


def _finish_reason(choice: ChoiceStats) -> FinishReason:
    return cast(FinishReason, choice.finish_reason)


@post(
    "/v1/chat/completions",
    status_code=200,
    opt={"generation": True},
    operation_class=documented(
        {200: {JSON: ChatCompletion, sse.MEDIA_TYPE: sse_events(ChatCompletionChunk, OpenAIErrorResponse)}, **_ERRORS},
        body=ChatCompletionRequest,
    ),
    summary="OpenAI-compatible chat completion",
    description=(
        "OpenAI's chat request over the model's chat template (rendered with the generation prompt; "
        "400 when the model has none), with every sampling field of /v1/completions. Without "
        "max_completion_tokens or max_tokens a reply may use what the context leaves after the prompt "
        f"(at most {limits.MAX_NEW_TOKENS} tokens). A reply ends at the model's end-of-text ids and the "
        "template's end-of-turn tokens. A stream sends each choice's role first, then its content, then "
        "an empty delta with its finish_reason, then [DONE]."
    ),
)
async def chat_completions(request: Request[Any, Any, Any], server: ServerState) -> Response[Any]:
    return await serve_generation(request, server, ChatCompletionRequest, ChatReply, error_response)
