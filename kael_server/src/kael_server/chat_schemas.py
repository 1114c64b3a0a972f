"""Bodies of ``POST /v1/chat/completions`` as msgspec Structs: OpenAI's chat request and its answers.

The request shares every sampling field with ``/v1/completions`` (``schemas.SamplingRequest``);
``messages`` is checked message by message in ``kael_server.chat`` (so an error can name
``messages[2].content[1].type``), and documented here with its exact JSON Schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from kael_server import limits
from kael_server.schemas import CompletionMaxTokens, OptionalFlag, SamplingRequest, Usage

__all__ = [
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatDelta",
    "ChatLogprobs",
    "ChatMessage",
    "ChatMessages",
    "ChatTokenLogprob",
    "ChatTopLogprob",
    "TopLogprobs",
]

_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
        "name": {"type": "string"},
    },
}
ChatMessages = Annotated[
    list[dict[str, Any]],
    Meta(
        min_length=1,
        max_length=limits.MAX_MESSAGES,
        description="The conversation so far, rendered with the model's chat template. content is a "
        'string or a list of {"type": "text", "text": ...} parts (joined with newlines); a '
        "developer message is a system message.",
        extra_json_schema={
            "x-kael-schema": {"type": "array", "minItems": 1, "maxItems": limits.MAX_MESSAGES, "items": _MESSAGE}
        },
        extra={
            "expect": f"a list of 1 to {limits.MAX_MESSAGES} message objects",
            "empty": "the conversation has no messages",
        },
    ),
]
TopLogprobs = Annotated[
    int,
    Meta(
        ge=0,
        le=limits.MAX_TOP_LOGPROBS,
        description="With logprobs: this many most likely tokens at each position.",
        extra={"expect": f"an integer from 0 to {limits.MAX_TOP_LOGPROBS}"},
    ),
]


class ChatCompletionRequest(SamplingRequest, kw_only=True):
    """Body of ``POST /v1/chat/completions``: OpenAI's chat request (text messages)."""

    messages: ChatMessages
    max_tokens: (
        Annotated[
            CompletionMaxTokens,
            Meta(description="Tokens to generate for each choice (deprecated by OpenAI: max_completion_tokens)."),
        ]
        | None
    ) = None
    max_completion_tokens: (
        Annotated[
            CompletionMaxTokens,
            Meta(
                description="Tokens to generate for each choice; without it (and max_tokens), what the "
                f"context leaves after the prompt, at most {limits.MAX_NEW_TOKENS}."
            ),
        ]
        | None
    ) = None
    logprobs: OptionalFlag = False
    """Each generated token's log-probability (in ``choices[i].logprobs.content``)."""
    top_logprobs: TopLogprobs | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatTopLogprob(msgspec.Struct, kw_only=True):
    token: str
    """The token's text (``bytes:\\xNN`` for a part of a UTF-8 character)."""
    logprob: float
    bytes: list[int]
    """The token's UTF-8 bytes."""


class ChatTokenLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[ChatTopLogprob]
    """The ``top_logprobs`` most likely tokens at this position, most likely first."""


class ChatLogprobs(msgspec.Struct, kw_only=True):
    content: list[ChatTokenLogprob] | None
    refusal: None = None


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: ChatMessage
    finish_reason: Literal["stop", "length"]
    logprobs: ChatLogprobs | None = None


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ChatDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a stream event adds to a choice's message: ``role`` first, then ``content`` pieces;
    empty in the last event of the choice (the one with its finish_reason)."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: ChatDelta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    """Only in the last event, with ``stream_options.include_usage`` (and no choices)."""
    system_fingerprint: str | None = None
