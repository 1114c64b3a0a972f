"""Response bodies the server sends, as msgspec Structs (one definition for encoding and OpenAPI).

kael's ``/generate`` answer and stream events, ``/health``, OpenAI's completion object (choices,
logprobs, usage), the model list, and the ``/tokenize`` and ``/detokenize`` answers. Request
bodies, whose fields carry their validation, are in ``kael_server.schemas`` (which re-exports
these).
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = [
    "Completion",
    "CompletionChoice",
    "CompletionLogprobs",
    "DetokenizeResponse",
    "GenerateResponse",
    "HealthResponse",
    "ModelCard",
    "ModelList",
    "PromptTokensDetails",
    "StreamError",
    "TextEvent",
    "TokenizeResponse",
    "Usage",
]


class GenerateResponse(msgspec.Struct, kw_only=True):
    text: str
    """The continuation only, without the prompt."""
    tokens: int
    seconds: float
    """Wall time of the generation itself."""


class TextEvent(msgspec.Struct):
    """One server-sent event of a ``/generate`` stream."""

    text: str


class StreamError(msgspec.Struct):
    error: str


class HealthResponse(msgspec.Struct):
    status: str


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    """OpenAI's legacy ``logprobs`` object: one entry per token of the choice's text."""

    tokens: list[str]
    """Each token's text (``bytes:\\xNN`` for a part of a UTF-8 character)."""
    token_logprobs: list[float | None]
    """The token's log-probability under the model (the first echoed prompt token: null)."""
    top_logprobs: list[dict[str, float] | None]
    """The most likely tokens at that position, and the chosen one."""
    text_offset: list[int]
    """Where the token starts in the choice's text, in characters."""


class CompletionChoice(msgspec.Struct, kw_only=True):
    text: str
    index: int = 0
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    """What OpenAI reports of the prompt tokens: how many came from the prompt (prefix) cache."""

    cached_tokens: int = 0


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    """``cached_tokens``: prompt tokens whose keys and values the paged KV cache reused."""


class Completion(msgspec.Struct, kw_only=True):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(msgspec.Struct, kw_only=True):
    """One served model (OpenAI's model object; ``GET /v1/models/{id}``)."""

    id: str
    object: str = "model"
    created: int
    owned_by: str = "kael"
    max_model_len: int
    weights: str = "f32"  # the weights' format (kael-server --weights; a GGUF file's most common tensor type)
    chat: bool = False
    """Whether the model has a chat template (``/v1/chat/completions`` answers; the playground's chat)."""


class ModelList(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[ModelCard]


class TokenizeResponse(msgspec.Struct, kw_only=True):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(msgspec.Struct):
    prompt: str
