"""Which request fields outside kael's schema are refused and which are accepted (issue 30).

A field that would change what is generated is never ignored: kael implements it, or the
request is a 400 naming it (``UNSUPPORTED``, with the reason and what to use instead). A field
that changes nothing kael generates (``INERT``: bookkeeping, routing, caching hints) is accepted
silently. Any other unknown field is ignored and named in a log warning, as vLLM and
llama.cpp's servers do (a client library's new field must not break every request). The
table in kael_server's README lists both sets.
"""

from __future__ import annotations

__all__ = ["INERT", "UNSUPPORTED"]

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
