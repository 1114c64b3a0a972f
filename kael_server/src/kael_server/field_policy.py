"""Which request fields outside kael's schema are refused and which are accepted (issue 30).

A field that would change what is generated is never ignored: kael implements it, or the
request is a 400 naming it (``UNSUPPORTED``, with the reason and what to use instead). A field
that changes nothing kael generates (``INERT``: bookkeeping, routing, caching hints) is accepted
silently. Any other unknown field is ignored and named in a log warning, as vLLM and
llama.cpp's servers do (a client library's new field must not break every request). The
table in kael_server's README lists both sets.
"""

from __future__ import annotations

from typing import Any

__all__ = ["INERT", "NEUTRAL", "UNSUPPORTED", "refused"]

UNSUPPORTED: dict[str, str] = {
    "functions": "the legacy function-calling API is not supported; use tools",
    "function_call": "the legacy function-calling API is not supported; use tool_choice",
    "audio": "kael generates text only",
    "modalities": "kael generates text only",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "kael has no web search",
    "reasoning_effort": "the served models do not reason in a separate channel",
    "verbosity": "not supported by kael's models",
    "logits_processors": "server-side logits processors are not loadable per request",
    "bad_words": "not supported; use logit_bias",
    "allowed_token_ids": "not supported; use logit_bias or a constraint (structured_outputs)",
    "use_beam_search": "beam search is not supported",
    "length_penalty": "beam search is not supported",
    "typical_p": "typical sampling is not supported; use top_p or min_p",
    "mirostat": "mirostat sampling is not supported",
    "mirostat_tau": "mirostat sampling is not supported",
    "mirostat_eta": "mirostat sampling is not supported",
    "tfs_z": "tail-free sampling is not supported",
    "dry_multiplier": "DRY sampling is not supported; use the repetition penalties",
    "xtc_probability": "XTC sampling is not supported",
    "guided_whitespace_pattern": "whitespace in JSON output is not configurable",
    "structural_tag": "structural tags are not supported; use tools or a grammar",
    "include_stop_str_in_output": "stop strings are never part of the output",
    "skip_special_tokens": "special tokens are always skipped",
    "truncate_prompt_tokens": "prompts are never truncated; a prompt over the context is a 413",
    "prompt_logprobs": "prompt logprobs are returned with echo and logprobs on /v1/completions",
    "chat_template": "the model's own chat template is used",
    "chat_template_kwargs": "template variables are not supported",
    "continue_final_message": "not supported: a reply is always a new assistant turn",
    "add_generation_prompt": "the generation prompt is always added",
    "documents": "retrieval documents are not rendered",
    "n_probs": "use logprobs (top_logprobs in chat)",
    "samplers": "the sampling order is fixed (logit_bias, penalties, temperature, top_k, top_p, min_p)",
}
"""Fields that change what is generated and that kael does not implement, with why."""

NEUTRAL: dict[str, tuple[Any, ...]] = {
    "functions": ([],),
    "function_call": ("none",),
    "modalities": (["text"],),
    "logits_processors": ([],),
    "bad_words": ([],),
    "use_beam_search": (False,),
    "length_penalty": (1, 1.0),
    "typical_p": (1, 1.0),
    "mirostat": (0,),
    "mirostat_tau": (5, 5.0),
    "mirostat_eta": (0.1,),
    "tfs_z": (1, 1.0),
    "dry_multiplier": (0, 0.0),
    "xtc_probability": (0, 0.0),
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "chat_template_kwargs": ({},),
    "continue_final_message": (False,),
    "add_generation_prompt": (True,),
    "documents": ([],),
    "n_probs": (0,),
}
"""Values of ``UNSUPPORTED`` fields that ask for what kael does anyway (llama.cpp's and vLLM's
clients send these defaults): accepted. null is always accepted."""


def _same(value: Any, neutral: Any) -> bool:
    if isinstance(value, bool) or isinstance(neutral, bool):  # 0 is not False here
        return type(value) is type(neutral) and value == neutral
    return bool(value == neutral)


def refused(name: str, value: Any) -> str | None:
    """Why field ``name`` with ``value`` is refused (None: it is not, or asks for nothing)."""
    if name not in UNSUPPORTED or value is None or any(_same(value, n) for n in NEUTRAL.get(name, ())):
        return None
    return UNSUPPORTED[name]


INERT = frozenset(
    {
        "user",
        "metadata",
        "store",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "request_id",
        "priority",
        "cache_prompt",
        "guided_decoding_backend",
        "id_slot",
        "return_tokens",
    }
)
"""Fields accepted without a warning: they change nothing kael generates (bookkeeping, caching
and scheduling hints; kael always picks its one grammar library)."""
