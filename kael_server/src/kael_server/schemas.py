"""Request and response bodies as msgspec Structs: one definition for validation, encoding and OpenAPI.

Each constrained field carries ``Meta(extra={"expect": ...})``: the phrase a 422 answer uses to
say what was expected, so error messages name the field and the rule but never repeat the input.
A field may add ``"check"`` for a rule JSON Schema expresses but msgspec cannot enforce alone.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from kael_server import limits

Prompt = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=limits.MAX_PROMPT_CHARS,
        description="Text to continue.",
        extra={"expect": f"a string of 1 to {limits.MAX_PROMPT_CHARS} characters"},
    ),
]
Temperature = Annotated[
    float,
    Meta(
        ge=0,
        le=limits.MAX_TEMPERATURE,
        description="0 for greedy decoding, else the softmax temperature (0.001 to 10).",
        extra_json_schema={
            "anyOf": [
                {"const": 0},
                {"minimum": limits.MIN_SAMPLING_TEMPERATURE, "maximum": limits.MAX_TEMPERATURE},
            ]
        },
        extra={"expect": "0, or a number from 0.001 to 10", "check": limits.temperature_ok},
    ),
]
TopK = Annotated[
    int,
    Meta(
        ge=0,
        le=limits.MAX_TOP_K,
        description="Sample among the k most likely tokens; 0 means all. Clamped to the vocabulary.",
        extra={"expect": f"an integer from 0 to {limits.MAX_TOP_K}"},
    ),
]
Seed = Annotated[
    int,
    Meta(
        ge=0,
        le=limits.MAX_SEED,
        description="Seed for sampling; the same seed gives the same text.",
        extra={"expect": "an integer from 0 to 2**63 - 1"},
    ),
]


MaxTokens = Annotated[
    int,
    Meta(
        ge=1,
        le=limits.MAX_NEW_TOKENS,
        description="Number of tokens to generate.",
        extra={"expect": f"an integer from 1 to {limits.MAX_NEW_TOKENS}"},
    ),
]
Flag = Annotated[bool, Meta(extra={"expect": "true or false"})]
OptionalText = Annotated[str | None, Meta(extra={"expect": "a string or null"})]


class GenerateRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Body of ``POST /generate``."""

    prompt: Prompt
    max_tokens: MaxTokens = 64
    temperature: Temperature = 0.8
    top_k: TopK = 40
    seed: Seed | None = None
    stream: Flag = False


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


class FieldErrorBody(msgspec.Struct):
    loc: str
    msg: str


class ErrorResponse(msgspec.Struct, kw_only=True):
    detail: str
    errors: list[FieldErrorBody] | None = None


class HealthResponse(msgspec.Struct):
    status: str


# ---- OpenAI-compatible API ------------------------------------------------------------

StopString = Annotated[
    str, Meta(min_length=1, max_length=limits.MAX_STOP_CHARS, extra={"expect": "a non-empty string"})
]
Stop = Annotated[
    StopString | Annotated[list[StopString], Meta(max_length=limits.MAX_STOP_STRINGS)] | None,
    Meta(
        description="Generation stops before the first of these strings; it is not returned.",
        extra={
            "expect": f"a string or a list of up to {limits.MAX_STOP_STRINGS} strings "
            f"of 1 to {limits.MAX_STOP_CHARS} characters"
        },
    ),
]


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    include_usage: Flag = False


class CompletionRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Body of ``POST /v1/completions`` (the subset of OpenAI's that a single-sequence GPT-2 serves)."""

    prompt: Prompt
    model: OptionalText = None
    max_tokens: MaxTokens = 16
    temperature: Temperature = 1.0
    top_p: Annotated[float, Meta(ge=1, le=1, description="Only 1 (no nucleus sampling).", extra={"expect": "1"})] = 1.0
    top_k: TopK = 0
    n: Annotated[int, Meta(ge=1, le=1, description="Only 1.", extra={"expect": "1"})] = 1
    stop: Stop = None
    seed: Seed | None = None
    stream: Flag = False
    stream_options: Annotated[
        StreamOptions | None, Meta(extra={"expect": 'null or {"include_usage": true or false}'})
    ] = None
    echo: Annotated[
        bool,
        Meta(
            description="Only false.",
            extra_json_schema={"const": False},
            extra={"expect": "false", "check": lambda v: v is False},
        ),
    ] = False
    user: OptionalText = None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionChoice(msgspec.Struct, kw_only=True):
    text: str
    index: int = 0
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Completion(msgspec.Struct, kw_only=True):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class OpenAIError(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorResponse(msgspec.Struct):
    error: OpenAIError


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "kael"
    max_model_len: int


class ModelList(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[ModelCard]


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prompt: Prompt


class TokenizeResponse(msgspec.Struct, kw_only=True):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    tokens: Annotated[
        list[Annotated[int, Meta(ge=0)]],
        Meta(
            max_length=limits.MAX_DETOKENIZE_IDS,
            description="Token ids, each below the vocabulary size.",
            extra={"expect": f"a list of up to {limits.MAX_DETOKENIZE_IDS} token ids"},
        ),
    ]


class DetokenizeResponse(msgspec.Struct):
    prompt: str
