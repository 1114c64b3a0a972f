"""The reference side of test_tool_calls_reference.py: transformers' response templates for
kael's tool-call formats, and both parsers' results as comparable (content, [(name, arguments)]).

The response templates, one per format:

- ``hermes``: transformers' own template for the Qwen2/2.5/3 families
  (``transformers.cli.serving.utils._RESPONSE_TEMPLATE_FALLBACKS``, the one ``transformers
  serve`` uses when a Qwen tokenizer ships none), imported rather than copied.
- ``llama3_json``, ``mistral`` (v3 list and v11 ``name[ARGS]`` variants) and the generic
  ``json`` format: no vendor repository ships a ``response_template`` for them (Meta's and
  Mistral's tokenizer configs have none, and transformers has no fallback for ``llama`` or
  ``mistral``), so they are written here as faithfully as the regions the vendors' chat
  templates / model cards define allow: Llama 3.1's JSON tool call is the whole reply
  (optionally after ``<|python_tag|>``), several calls ``;``-separated; Mistral's v3 reply is
  ``[TOOL_CALLS]`` then a JSON list, v11's is ``[TOOL_CALLS]name[ARGS]{...}`` per call (the
  tokenizer version fixes which, so a model ships one of the two templates); the generic format
  is one JSON object or a list. The generic template has no ``transform`` (one object and a list
  need different ones); ``reference_turn`` flattens its value.

Like the vendors' own, these templates find the regions with regexes, not a JSON scanner: a
``;{`` (Llama), ``[TOOL_CALLS]`` (Mistral v11) or ``</tool_call>`` (Hermes) inside an argument
string ends the call early; the tests keep those cases apart (``DISAGREE``).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from kael_server.tools import Format, ToolCallStream, parse_tool_calls
from transformers.cli.serving.utils import _RESPONSE_TEMPLATE_FALLBACKS
from transformers.utils.chat_parsing import ResponseParser

__all__ = [
    "HERMES_TEMPLATE",
    "JSON_TEMPLATE",
    "LLAMA3_JSON_TEMPLATE",
    "MISTRAL_V11_TEMPLATE",
    "MISTRAL_V3_TEMPLATE",
    "Calls",
    "kael_stream",
    "kael_turn",
    "reference_stream",
    "reference_turn",
    "template_for",
]

Calls = list[tuple[str, Any]]

HERMES_TEMPLATE: dict[str, Any] = next(v for k, v in _RESPONSE_TEMPLATE_FALLBACKS.items() if "qwen2" in k)

_EOT = r"\s*(?:<\|eot_id\|>|<\|eom_id\|>)"
LLAMA3_JSON_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "fields": {
        "tool_calls": {
            # the reply opens with a JSON object (after an optional <|python_tag|>); further
            # calls follow a ';'
            "open_pattern": r"^\s*(?:<\|python_tag\|>)?\s*(?=\{)|\s*;\s*(?=\{)",
            "close_pattern": r"(?=\s*;\s*\{)|" + _EOT,
            "repeats": True,
            "content": "json",
            "transform": {
                "type": "function",
                "function": {"name": "{content.name}", "arguments": "{content.parameters}"},
            },
        },
        "content": {"close_pattern": _EOT, "content": "text"},
    },
}

MISTRAL_V3_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "[/INST]",
    "fields": {
        "tool_calls": {
            "open": "[TOOL_CALLS]",
            "close": "</s>",
            "content": "json",
            "transform_each": True,
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{arguments}"}},
        },
        "content": {"close": "</s>", "content": "text"},
    },
}

MISTRAL_V11_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "[/INST]",
    "fields": {
        "tool_calls": {
            "open_pattern": r"\[TOOL_CALLS\](?P<name>[^\[\]]+?)\[ARGS\]",
            "close_pattern": r"(?=\[TOOL_CALLS\])|</s>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
        },
        "content": {"close": "</s>", "content": "text"},
    },
}

JSON_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|assistant|>",
    "fields": {
        "tool_calls": {"open_pattern": r"^\s*(?=[\[{])", "content": "json"},
        "content": {"content": "text"},
    },
}


def template_for(fmt: Format, text: str) -> dict[str, Any]:
    """The response template a model in format ``fmt`` ships (Mistral: the one of the
    tokenizer version that wrote ``text``)."""
    if fmt == "hermes":
        return HERMES_TEMPLATE
    if fmt == "llama3_json":
        return LLAMA3_JSON_TEMPLATE
    if fmt == "mistral":
        return MISTRAL_V3_TEMPLATE if "[TOOL_CALLS][" in text.replace(" ", "") else MISTRAL_V11_TEMPLATE
    return JSON_TEMPLATE


def reference_turn(message: dict[str, Any]) -> tuple[str | None, Calls]:
    """(content, [(name, arguments)]) of a message dict transformers' parser returns."""
    raw = message.get("tool_calls", [])
    items = raw if isinstance(raw, list) else [raw]
    calls = []
    for c in items:
        fn = c.get("function", c)
        args = fn.get("arguments", {})
        calls.append((fn["name"], json.loads(args) if isinstance(args, str) else args))
    return message.get("content") or None, calls


def kael_turn(text: str, fmt: Format) -> tuple[str | None, Calls]:
    """(content, [(name, arguments)]) of kael's non-streaming parse."""
    turn = parse_tool_calls(text, fmt)
    return turn.content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in turn.tool_calls]


def kael_stream(text: str, fmt: Format, bounds: list[int]) -> tuple[str | None, Calls]:
    """Feed ``text[bounds[i]:bounds[i+1]]`` to a ``ToolCallStream``; reassemble the deltas as an
    OpenAI client does."""
    stream = ToolCallStream(fmt)
    deltas = [d for a, b in itertools.pairwise(bounds) for d in stream.feed(text[a:b])] + stream.finish()
    content = ""
    calls: list[list[Any]] = []
    for d in deltas:
        content += d.get("content", "")
        for tc in d.get("tool_calls", []):
            if "id" in tc:
                assert tc["index"] == len(calls)
                calls.append([tc["function"]["name"], tc["function"]["arguments"]])
            else:
                calls[tc["index"]][1] += tc["function"]["arguments"]
    return content.strip() or None, [(n, json.loads(a)) for n, a in calls]


def reference_stream(text: str, fmt: Format, bounds: list[int]) -> tuple[str | None, Calls]:
    """The same chunks through transformers' streaming ``ResponseParser``."""
    parser = ResponseParser(template_for(fmt, text), prefix="")
    for a, b in itertools.pairwise(bounds):
        parser.feed(text[a:b])
    message, _ = parser.finalize()
    return reference_turn(message)
