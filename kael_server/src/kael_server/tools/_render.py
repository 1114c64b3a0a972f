"""Rendering ``tools`` and tool-call turns through a chat template the way Hugging Face's
``apply_chat_template(messages, tools=...)`` does for the dict arguments its templates expect:
OpenAI messages carry ``function.arguments`` as a JSON string, which is decoded to an object
first (vLLM does the same), so ``{{ tool_call.arguments | tojson }}`` renders it once."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kael import KaelError
from kael.tokenizer import ChatTemplate

__all__ = ["render_with_tools", "template_messages"]


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``messages`` with each assistant ``tool_calls[i].function.arguments`` JSON
    string decoded (a string that is not a JSON object is a ``KaelError`` naming it)."""
    out = []
    for m, msg in enumerate(messages):
        new = dict(msg)
        calls = msg.get("tool_calls")
        if calls:
            new_calls = []
            for c, call in enumerate(calls):
                call = dict(call)
                fn = dict(call.get("function", {}))
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        fn["arguments"] = json.loads(args)
                    except json.JSONDecodeError as e:
                        raise KaelError(
                            f"messages[{m}].tool_calls[{c}].function.arguments: not valid JSON ({e.msg})"
                        ) from None
                    if not isinstance(fn["arguments"], dict):
                        raise KaelError(f"messages[{m}].tool_calls[{c}].function.arguments: expected a JSON object")
                call["function"] = fn
                new_calls.append(call)
            new["tool_calls"] = new_calls
        out.append(new)
    return out


def render_with_tools(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    add_generation_prompt: bool = True,
    **variables: Any,
) -> str:
    """The prompt for OpenAI-style ``messages`` and ``tools`` (None: no tools), as
    ``apply_chat_template(messages, tools=tools, tokenize=False)`` renders it."""
    return template.render(
        template_messages(messages),
        add_generation_prompt=add_generation_prompt,
        tools=[dict(t) for t in tools] if tools else None,
        **variables,
    )
