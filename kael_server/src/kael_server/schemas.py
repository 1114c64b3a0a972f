"""Request and response bodies as msgspec Structs: one definition for validation, encoding and OpenAPI.

Each constrained field carries ``Meta(extra={"expect": ...})``: the phrase a 422 answer uses to
say what was expected, so error messages name the field and the rule but never repeat the input.
A field may add ``"check"`` for a rule JSON Schema expresses but msgspec cannot enforce alone,
and ``"empty"``: the message for an empty value ("", [] or a list holding one), which says so.
Structs without ``forbid_unknown_fields`` (the OpenAI requests) ignore unknown fields.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec
from msgspec import Meta

from kael_server import field_policy, limits
from kael_server.structured_schemas import (
    ChoiceList,
    Grammar,
    GuidedJson,
    JsonObject,
    Pattern,
    ResponseFormat,
    StructuredOutputs,
)

__all__ = [
    "BestOf",
    "Choices",
    "CompletionMaxTokens",
    "CompletionRequest",
    "CompletionSeed",
    "CompletionTopK",
    "DetokenizeRequest",
    "ErrorResponse",
    "FieldErrorBody",
    "Flag",
    "GenerateRequest",
    "LogitBias",
    "Logprobs",
    "MaxTokens",
    "MinP",
    "MinTokens",
    "OpenAIError",
    "OpenAIErrorResponse",
    "OptionalFlag",
    "OptionalText",
    "Penalty",
    "Prompt",
    "PromptInput",
    "RepetitionPenalty",
    "SamplingRequest",
    "Seed",
    "Stop",
    "StopString",
    "StreamOptions",
    "Suffix",
    "Temperature",
    "TokenizeRequest",
    "TopK",
    "TopP",
]

Prompt = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=limits.MAX_PROMPT_CHARS,
        description="Text to continue.",
        extra={"expect": f"a string of 1 to {limits.MAX_PROMPT_CHARS} characters", "empty": "the prompt is empty"},
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


class FieldErrorBody(msgspec.Struct):
    loc: str
    msg: str


class ErrorResponse(msgspec.Struct, kw_only=True):
    detail: str
    errors: list[FieldErrorBody] | None = None


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


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: Annotated[bool, Meta(extra={"expect": "true or false"})] | None = False
    """A last event with ``usage`` and no choices."""


def _prompt_ok(value: object) -> bool:
    """One of the four shapes OpenAI's ``prompt`` takes, each within its limits."""
    if isinstance(value, str):
        return 1 <= len(value) <= limits.MAX_PROMPT_CHARS
    if not isinstance(value, list) or not value:
        return False
    if all(isinstance(v, str) for v in value):
        return len(value) <= limits.MAX_PROMPTS and all(1 <= len(v) <= limits.MAX_PROMPT_CHARS for v in value)
    if all(isinstance(v, int) for v in value):
        return _ids_ok(value)
    return len(value) <= limits.MAX_PROMPTS and all(isinstance(v, list) and _ids_ok(v) for v in value)


def _ids_ok(ids: list[object]) -> bool:
    return 1 <= len(ids) <= limits.MAX_PROMPT_TOKENS and all(isinstance(i, int) and i >= 0 for i in ids)


_TEXT_SCHEMA = {"type": "string", "minLength": 1, "maxLength": limits.MAX_PROMPT_CHARS}
_IDS_SCHEMA = {
    "type": "array",
    "minItems": 1,
    "maxItems": limits.MAX_PROMPT_TOKENS,
    "items": {"type": "integer", "minimum": 0},
}
PromptInput = Annotated[
    str | list[str | int | list[int]],
    Meta(
        description="Text to continue; a list of texts (each its own n choices, numbered prompt by "
        "prompt); token ids; or a list of token-id lists.",
        # openapi.schema_of puts this in place of msgspec's looser union (which mixes the shapes)
        extra_json_schema={
            "x-kael-schema": {
                "anyOf": [
                    _TEXT_SCHEMA,
                    {"type": "array", "minItems": 1, "maxItems": limits.MAX_PROMPTS, "items": _TEXT_SCHEMA},
                    _IDS_SCHEMA,
                    {"type": "array", "minItems": 1, "maxItems": limits.MAX_PROMPTS, "items": _IDS_SCHEMA},
                ]
            }
        },
        extra={
            "expect": f"a string of 1 to {limits.MAX_PROMPT_CHARS} characters, a list of up to "
            f"{limits.MAX_PROMPTS} such strings, a list of 1 to {limits.MAX_PROMPT_TOKENS} token ids, "
            f"or a list of up to {limits.MAX_PROMPTS} such lists",
            "check": _prompt_ok,
            "empty": "the prompt is empty",
        },
    ),
]
CompletionMaxTokens = Annotated[
    int,
    Meta(
        ge=0,
        le=limits.MAX_NEW_TOKENS,
        description="Tokens to generate for each choice; 0 only with echo (the prompt and its logprobs alone).",
        extra={"expect": f"an integer from 0 to {limits.MAX_NEW_TOKENS} (0 only with echo)"},
    ),
]
TopP = Annotated[
    float,
    Meta(
        gt=0,
        le=1,
        description="Nucleus sampling: only the most likely tokens whose probabilities add up to top_p.",
        extra={"expect": "a number greater than 0 and at most 1"},
    ),
]
MinP = Annotated[
    float,
    Meta(
        ge=0,
        le=1,
        description="Drop tokens less likely than min_p times the most likely one (vLLM).",
        extra={"expect": "a number from 0 to 1"},
    ),
]
Penalty = Annotated[
    float,
    Meta(ge=-2, le=2, extra={"expect": "a number from -2 to 2"}),
]
RepetitionPenalty = Annotated[
    float,
    Meta(
        gt=0,
        le=10,
        description="vLLM's: a seen token's positive logit is divided by it, a negative one multiplied.",
        extra={"expect": "a number greater than 0 and at most 10"},
    ),
]
Choices = Annotated[
    int,
    Meta(
        ge=1,
        le=limits.MAX_CHOICES,
        description="Choices per prompt, from one shared prompt encoding (and prefill, when batched).",
        extra={"expect": f"an integer from 1 to {limits.MAX_CHOICES}"},
    ),
]
CompletionTopK = Annotated[
    int,
    Meta(
        ge=-1,
        le=limits.MAX_TOP_K,
        description="Sample among the k most likely tokens; 0 or -1 means all (vLLM).",
        extra={"expect": f"an integer from -1 to {limits.MAX_TOP_K}"},
    ),
]
LogitBias = Annotated[
    dict[
        Annotated[str, Meta(pattern="^[0-9]{1,10}$")],
        Annotated[float, Meta(ge=-100, le=100)],
    ],
    Meta(
        max_length=limits.MAX_LOGIT_BIAS,
        description="Token id (as a string) -> a bias from -100 to 100, added to its logit.",
        extra={
            "expect": f"an object of up to {limits.MAX_LOGIT_BIAS} token ids (strings of digits) "
            "mapped to numbers from -100 to 100"
        },
    ),
]
Logprobs = Annotated[
    int,
    Meta(
        ge=0,
        le=limits.MAX_LOGPROBS,
        description="Each token's log-probability and this many most likely alternatives.",
        extra={"expect": f"an integer from 0 to {limits.MAX_LOGPROBS}"},
    ),
]
BestOf = Annotated[
    int,
    Meta(
        ge=1,
        le=limits.MAX_CHOICES,
        description="Only null or n: every choice generated is returned.",
        extra={"expect": "null or the value of n"},
    ),
]
MinTokens = Annotated[
    int,
    Meta(
        ge=0,
        le=limits.MAX_NEW_TOKENS,
        description="End of text and stop strings wait until this many tokens (vLLM).",
        extra={"expect": f"an integer from 0 to {limits.MAX_NEW_TOKENS}"},
    ),
]
CompletionSeed = Annotated[
    int,
    Meta(
        ge=limits.MIN_OPENAI_SEED,
        le=limits.MAX_SEED,
        description="Seed for sampling: the same seed gives the same text; choice i of a prompt uses seed + i.",
        extra={"expect": "a 64-bit signed integer"},
    ),
]
Suffix = Annotated[
    None,
    Meta(
        description="Only null: kael does not insert text between a prompt and a suffix.",
        extra={"expect": "null (kael does not insert text between a prompt and a suffix)"},
    ),
]
OptionalFlag = Annotated[bool, Meta(extra={"expect": "true or false"})] | None


class SamplingRequest(msgspec.Struct, kw_only=True):
    """The fields OpenAI's completion and chat requests share (with vLLM's extras ``top_k``,
    ``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos``). Each may be null for its
    default. Fields outside the schema are ignored and named in a log warning."""

    model: OptionalText = None
    """Any name: the server answers with the model it serves."""
    max_tokens: CompletionMaxTokens | None = 16
    temperature: Temperature | None = 1.0
    top_p: TopP | None = 1.0
    n: Choices | None = 1
    stream: OptionalFlag = False
    stream_options: Annotated[
        StreamOptions | None, Meta(extra={"expect": 'null or {"include_usage": true or false}'})
    ] = None
    stop: Stop = None
    presence_penalty: (
        Annotated[Penalty, Meta(description="Subtracted from the logit of every token already generated.")] | None
    ) = 0.0
    frequency_penalty: (
        Annotated[Penalty, Meta(description="Times a token was generated, times this, is subtracted from its logit.")]
        | None
    ) = 0.0
    logit_bias: LogitBias | None = None
    seed: CompletionSeed | None = None
    user: OptionalText = None
    top_k: CompletionTopK | None = 0
    min_p: MinP | None = 0.0
    repetition_penalty: RepetitionPenalty | None = 1.0
    min_tokens: MinTokens | None = 0
    ignore_eos: (
        Annotated[bool, Meta(description="Go on past the end-of-text token.", extra={"expect": "true or false"})] | None
    ) = False
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: GuidedJson | None = None
    guided_regex: Pattern | None = None
    guided_choice: ChoiceList | None = None
    guided_grammar: Grammar | None = None
    json_schema: Annotated[JsonObject, Meta(description="llama.cpp's: a JSON schema the output matches.")] | None = None
    grammar: Grammar | None = None

    unsupported_fields: ClassVar[dict[str, str]] = field_policy.UNSUPPORTED
    """Fields that would change the output and that kael does not implement: each is a 400."""
    inert_fields: ClassVar[frozenset[str]] = field_policy.INERT
    """Fields accepted without a warning that change nothing."""

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(SamplingRequest, kw_only=True):
    """Body of ``POST /v1/completions``: OpenAI's whole request schema."""

    prompt: PromptInput
    suffix: Suffix = None
    echo: (
        Annotated[
            bool,
            Meta(
                description="Each choice's text starts with its prompt (and its logprobs, with logprobs).",
                extra={"expect": "true or false"},
            ),
        ]
        | None
    ) = False
    logprobs: Logprobs | None = None
    best_of: BestOf | None = None


class OpenAIError(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorResponse(msgspec.Struct):
    error: OpenAIError


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prompt: Prompt


class DetokenizeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    tokens: Annotated[
        list[Annotated[int, Meta(ge=0)]],
        Meta(
            max_length=limits.MAX_DETOKENIZE_IDS,
            description="Token ids, each below the vocabulary size.",
            extra={"expect": f"a list of up to {limits.MAX_DETOKENIZE_IDS} token ids"},
        ),
    ]
