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
    DeltaFunction,
    DeltaToolCall,
    ToolCall,
    ToolCallFunction,
)
from kael_server.chat_tools import tool_request
from kael_server.driver import serve_generation
from kael_server.errors import FieldError, InvalidRequest, ServerError
from kael_server.generator import Generator
from kael_server.jobs import ChatPrompt, ChoiceStats, Finished, JobStats, Prompt, TextPiece, TokenInfo
from kael_server.openapi import JSON, documented, sse_events
from kael_server.replies import Usage
from kael_server.routes.openai import _usage, error_body, error_response, sampling_params, served_model
from kael_server.schemas import OpenAIErrorResponse
from kael_server.state import ServerState
from kael_server.structured import constrained
from kael_server.tools import ToolCallStream, parse_tool_calls

__all__ = ["ChatReply", "chat_completions", "token_bytes"]

_ERRORS: dict[int, dict[str, Any]] = {
    status: {JSON: OpenAIErrorResponse} for status in (400, 404, 413, 429, 499, 500, 503)
}
FinishReason = Literal["stop", "length", "tool_calls"]


class ChatReply:
    """One chat request: its rendered prompt, its SamplingParams and its wire format.

    With tools (and ``tool_choice`` not "none") each choice's output is parsed for tool calls
    in the format the template uses (``chat_tools``): a reply with calls has
    ``message.tool_calls`` and finish reason "tool_calls"; a stream sends ``delta.tool_calls``
    chunks (the id and name first, then the arguments' text as it is written)."""

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
        params = dataclasses.replace(params, stop_token_ids=generator.chat_stop_tokens, fit_context=given is None)
        special = generator.tokenizer.special_tokens
        tools = tool_request(body.tools, body.tool_choice, body.parallel_tool_calls, generator.chat_template, special)
        # the body is checked first (a malformed one is a 400 whatever it names), then the model (a
        # 404), then its constraint is compiled
        self.model = served_model(body.model, generator)
        self.params = constrained(params, body, generator, tools.constraint, extra_yields=tools.auto)
        self.fmt = tools.fmt
        prompt = render_chat(generator.chat_template, messages, generator.model_name, tools.tools)
        self.prompts: tuple[Prompt, ...] = (ChatPrompt(prompt),)
        self._streams: dict[int, ToolCallStream] = {}
        """Each streamed choice's tool-call parser (with tools)."""
        self.stream = bool(body.stream)
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
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
                message=(message := self._message(text)),
                finish_reason=_finish_reason(choice, bool(message.tool_calls)),
                logprobs=self._logprobs(choice.logprobs) if choice.logprobs is not None else None,
            )
            for i, (text, choice) in enumerate(zip(done.texts, stats.choices, strict=True))
        ]
        completion = ChatCompletion(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=_usage(stats)
        )
        return Response(completion)

    def _message(self, text: str) -> ChatMessage:
        if self.fmt is None:
            return ChatMessage(role="assistant", content=text)
        turn = parse_tool_calls(text, self.fmt)
        if not turn.tool_calls:
            return ChatMessage(role="assistant", content=text)
        calls = [
            ToolCall(
                id=c["id"], function=ToolCallFunction(name=c["function"]["name"], arguments=c["function"]["arguments"])
            )
            for c in turn.tool_calls
        ]
        return ChatMessage(role="assistant", content=turn.content, tool_calls=calls)

    def piece(self, piece: TextPiece) -> bytes:
        logprobs = self._logprobs(piece.logprobs) if self.params.logprobs is not None else None
        if self.fmt is None:
            deltas = [ChatDelta(content=piece.text)]
        else:
            stream = self._streams.setdefault(piece.index, ToolCallStream(self.fmt))
            deltas = [_delta(d) for d in stream.feed(piece.text)]
            if not deltas and logprobs is None:
                return self._start(piece.index)
            deltas = deltas or [ChatDelta(content="")]
        out = self._start(piece.index)
        for delta in deltas:  # the piece's logprobs go with its first chunk
            out += self._chunk([ChatChunkChoice(index=piece.index, delta=delta, logprobs=logprobs)])
            logprobs = None
        return out

    def finish(self, stats: JobStats) -> list[bytes]:
        chunks = []
        for i, choice in enumerate(stats.choices):
            start = self._start(i)
            stream = self._streams.get(i)
            called = False
            if stream is not None:
                for delta in stream.finish():
                    start += self._chunk([ChatChunkChoice(index=i, delta=_delta(delta))])
                called = stream.n_calls > 0
            ending = ChatChunkChoice(index=i, delta=ChatDelta(), finish_reason=_finish_reason(choice, called))
            chunks.append(start + self._chunk([ending]))
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


def _finish_reason(choice: ChoiceStats, called: bool = False) -> FinishReason:
    """ "tool_calls" for a reply that ended with calls, else the choice's own reason."""
    if called and choice.finish_reason == "stop":
        return "tool_calls"
    return cast(FinishReason, choice.finish_reason)


def _delta(d: dict[str, Any]) -> ChatDelta:
    """A ``ToolCallStream`` delta dict as a ChatDelta."""
    if "content" in d:
        return ChatDelta(content=d["content"])
    calls = []
    for c in d["tool_calls"]:
        fn = c.get("function", {})
        calls.append(
            DeltaToolCall(
                index=c["index"],
                id=c.get("id"),
                type=c.get("type"),
                function=DeltaFunction(name=fn.get("name"), arguments=fn.get("arguments")),
            )
        )
    return ChatDelta(tool_calls=calls)


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
    return await serve_generation(
        request, server, ChatCompletionRequest, ChatReply, error_response, limits.MAX_OPENAI_BODY_BYTES
    )
