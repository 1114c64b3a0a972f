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
from kael_server.replies import Usage
from kael_server.schemas import CompletionMaxTokens, OptionalFlag, SamplingRequest

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
    "DeltaFunction",
    "DeltaToolCall",
    "ToolCall",
    "ToolCallFunction",
    "ToolChoice",
    "Tools",
    "TopLogprobs",
]

_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
_TOOL_CALL = {
    "type": "object",
    "required": ["id", "type", "function"],
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
        },
    },
}
_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}, {"type": "null"}]},
        "name": {"type": "string"},
        "tool_calls": {"type": "array", "items": _TOOL_CALL},
        "tool_call_id": {"type": "string"},
    },
}
_TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                "description": {"type": "string"},
                "parameters": {"type": "object"},
                "strict": {"type": ["boolean", "null"]},
            },
        },
    },
}
ChatMessages = Annotated[
    list[dict[str, Any]],
    Meta(
        min_length=1,
        max_length=limits.MAX_MESSAGES,
        description="The conversation so far, rendered with the model's chat template. content is a "
        'string or a list of {"type": "text", "text": ...} parts (joined with newlines); a '
        "developer message is a system message; an assistant message may carry tool_calls (and null "
        "content), answered by tool messages with their tool_call_id.",
        extra_json_schema={
            "x-kael-schema": {"type": "array", "minItems": 1, "maxItems": limits.MAX_MESSAGES, "items": _MESSAGE}
        },
        extra={
            "expect": f"a list of 1 to {limits.MAX_MESSAGES} message objects",
            "empty": "the conversation has no messages",
        },
    ),
]
Tools = Annotated[
    list[dict[str, Any]],
    Meta(
        max_length=limits.MAX_TOOLS,
        description="Functions the model may call (JSON-schema parameters), passed to the chat template as "
        "Hugging Face's apply_chat_template(tools=...) does.",
        extra_json_schema={"x-kael-schema": {"type": "array", "maxItems": limits.MAX_TOOLS, "items": _TOOL}},
        extra={"expect": f"a list of up to {limits.MAX_TOOLS} function tools"},
    ),
]
ToolChoice = Annotated[
    str | dict[str, Any],
    Meta(
        description='"none", "auto" (the default with tools), "required" (at least one call, generated under '
        'a grammar of the tools\' schemas) or {"type": "function", "function": {"name": ...}} (that call).',
        extra={"expect": '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}'},
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
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: OptionalFlag = None
    """False: at most one call per reply (under tool_choice "required", enforced by its grammar)."""


class ToolCallFunction(msgspec.Struct, kw_only=True):
    """The function a tool call calls: its name and its arguments as a JSON object's text."""

    name: str
    arguments: str


class ToolCall(msgspec.Struct, kw_only=True):
    """One call the model made (OpenAI's ``message.tool_calls[i]``)."""

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The reply: its text (null when it is only tool calls) and the tool calls parsed from it."""

    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCall] | None = None
    """Omitted when the reply made no call."""


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
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChatLogprobs | None = None


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class DeltaFunction(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A tool call's name (in its first chunk) or a fragment of its arguments' text."""

    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A stream's piece of tool call ``index``: first its id, type and name, then argument fragments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction | None = None


class ChatDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a stream event adds to a choice's message: ``role`` first, then ``content`` pieces
    (or ``tool_calls`` pieces); empty in the last event of the choice (the one with its
    finish_reason)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: ChatDelta
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
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
