"""Request limits shared by validation, the routes and the OpenAPI schema."""

from __future__ import annotations

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_CHOICES",
    "MAX_DETOKENIZE_IDS",
    "MAX_LOGIT_BIAS",
    "MAX_LOGPROBS",
    "MAX_MESSAGES",
    "MAX_NEW_TOKENS",
    "MAX_OPENAI_BODY_BYTES",
    "MAX_PROMPTS",
    "MAX_PROMPT_CHARS",
    "MAX_PROMPT_TOKENS",
    "MAX_SEED",
    "MAX_STOP_CHARS",
    "MAX_STOP_STRINGS",
    "MAX_TEMPERATURE",
    "MAX_TOOLS",
    "MAX_TOP_K",
    "MAX_TOP_LOGPROBS",
    "MIN_OPENAI_SEED",
    "MIN_SAMPLING_TEMPERATURE",
    "RETRY_AFTER_SECONDS",
    "SHUTDOWN_DRAIN_SECONDS",
    "temperature_ok",
]

MAX_PROMPT_CHARS = 8192
MAX_NEW_TOKENS = 512
MAX_TOP_K = 1_000_000
MAX_TEMPERATURE = 10.0
MIN_SAMPLING_TEMPERATURE = 0.001
"""Below this (but above 0) softmax(logits / t) overflows; 0 itself means greedy."""
MAX_SEED = 2**63 - 1
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256
MAX_DETOKENIZE_IDS = 8192
MAX_PROMPTS = 16
"""Strings (or token-id lists) in one ``/v1/completions`` prompt list."""
MAX_PROMPT_TOKENS = 8192
"""Token ids in one prompt given as ids."""
MAX_CHOICES = 16
"""Sequences one request may ask for: ``n`` times the number of prompts."""
MAX_LOGPROBS = 5
MAX_TOP_LOGPROBS = 20
"""A chat request's ``top_logprobs`` (OpenAI's limit)."""
MAX_MESSAGES = 256
"""Messages in one ``/v1/chat/completions`` conversation."""
MAX_TOOLS = 128
"""Tools in one chat request (OpenAI's limit)."""
MAX_LOGIT_BIAS = 1024
"""Entries in ``logit_bias``."""
MIN_OPENAI_SEED = -(2**63)
"""OpenAI's ``seed`` is any 64-bit signed integer (kael's own ``/generate`` takes 0 to MAX_SEED)."""

MAX_BODY_BYTES = 6 * MAX_PROMPT_CHARS + 1024
"""A prompt of 8192 characters JSON-escaped as ``\\uXXXX`` is 6 bytes each, plus room for the other fields."""
MAX_OPENAI_BODY_BYTES = 8 << 20
"""A body of ``/v1/completions`` and ``/v1/chat/completions``: a conversation, its tools and a
JSON schema (each field with its own, smaller limit: a schema over its limit is a 400 naming it)."""

SHUTDOWN_DRAIN_SECONDS = 30.0
RETRY_AFTER_SECONDS = 1


def temperature_ok(value: float) -> bool:
    """0 (greedy) or a sampling temperature from 0.001 to 10."""
    return value == 0 or MIN_SAMPLING_TEMPERATURE <= value <= MAX_TEMPERATURE
