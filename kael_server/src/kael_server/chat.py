"""A chat request's conversation: its messages checked one by one, then rendered by the model's chat template.

Errors name the message and the field (``messages[1].content[0].type``) and say what was
expected; they never repeat the text of a message. The template runs in the sandbox of
``kael.tokenizer.ChatTemplate``; what it refuses (``raise_exception``, a role it does not
know) is the client's error, a 400 with the template's own message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kael_server.errors import ChatRejected, FieldError, InvalidRequest
from kael_server.protocols import ChatTemplate

__all__ = ["ROLES", "conversation", "render_chat"]

ROLES = ("system", "developer", "user", "assistant", "tool")
"""The roles a message may have; a developer message is rendered as a system message (OpenAI's
newer name for it); a tool message answers an assistant's tool call (``tool_call_id``)."""
_SHOWN = re.compile(r"^[a-z_]{1,32}$")
"""A part type short and plain enough to name in an error (``image_url``, ``input_audio``)."""
_MAX_TEMPLATE_MESSAGE = 500
"""Characters of a template's own error message passed on to the client."""


def conversation(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages as a chat template takes them (``role`` and a string ``content``; an
    assistant's ``tool_calls``, a tool message's ``tool_call_id`` and ``name``); raises
    InvalidRequest listing every message that is not a text message of a known role."""
    errors: list[FieldError] = []
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role")
        if "role" not in message:
            errors.append(FieldError(f"{where}.role", "field required"))
        elif role not in ROLES:
            errors.append(
                FieldError(
                    f"{where}.role",
                    f"expected one of {', '.join(repr(r) for r in ROLES)} (the legacy function role is not supported)",
                )
            )
        if "name" in message and not isinstance(message["name"], str):
            errors.append(FieldError(f"{where}.name", "expected a string"))
        calls = _tool_calls(message, where, errors) if role == "assistant" else None
        if role != "assistant" and message.get("tool_calls") is not None:
            errors.append(FieldError(f"{where}.tool_calls", "expected only on an assistant message"))
        optional = bool(calls)  # an assistant message of tool calls only may have null content
        content = "" if optional and message.get("content") is None else _content(message, where, errors)
        call_id = message.get("tool_call_id")
        if role == "tool" and not isinstance(call_id, str):
            errors.append(FieldError(f"{where}.tool_call_id", "expected the id of the tool call answered (a string)"))
        if content is not None and isinstance(role, str) and role in ROLES:
            entry: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content}
            if calls:
                entry["tool_calls"] = calls
            if role == "tool" and isinstance(call_id, str):
                entry["tool_call_id"] = call_id
            if role == "tool" and isinstance(message.get("name"), str):
                entry["name"] = message["name"]
            out.append(entry)
    if errors:
        raise InvalidRequest(errors)
    return out


def _tool_calls(message: Mapping[str, Any], where: str, errors: list[FieldError]) -> list[dict[str, Any]] | None:
    """An assistant message's ``tool_calls`` checked (ids, function names, arguments as the text
    of a JSON object), with each call's arguments decoded for the template (vLLM does so)."""
    calls = message.get("tool_calls")
    if calls is None:
        return None
    if not isinstance(calls, list):
        errors.append(FieldError(f"{where}.tool_calls", "expected a list of tool calls"))
        return None
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            errors.append(FieldError(f"{at}.function", 'expected {"name": ..., "arguments": ...}'))
            continue
        if not isinstance(call.get("id", ""), str):
            errors.append(FieldError(f"{at}.id", "expected a string"))
            continue
        args = fn.get("arguments", "{}")
        try:
            decoded = json.loads(args) if isinstance(args, str) else None
        except json.JSONDecodeError:
            decoded = None
        if not isinstance(decoded, dict):
            errors.append(FieldError(f"{at}.function.arguments", "expected the text of a JSON object"))
            continue
        out.append(
            {"id": call.get("id", ""), "type": "function", "function": {"name": fn["name"], "arguments": decoded}}
        )
    return out


def _content(message: Mapping[str, Any], where: str, errors: list[FieldError]) -> str | None:
    if "content" not in message:
        errors.append(FieldError(f"{where}.content", "field required"))
        return None
    content = message["content"]
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        errors.append(FieldError(f"{where}.content", 'expected a string or a list of {"type": "text"} parts'))
        return None
    texts: list[str] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict):
            errors.append(FieldError(at, 'expected a {"type": "text", "text": ...} object'))
            continue
        kind = part.get("type")
        if kind != "text":
            named = f", got {kind!r}" if isinstance(kind, str) and _SHOWN.match(kind) else ""
            errors.append(FieldError(f"{at}.type", f"expected 'text'{named} (kael serves text parts only)"))
            continue
        text = part.get("text")
        if not isinstance(text, str):
            errors.append(FieldError(f"{at}.text", "expected a string"))
            continue
        texts.append(text)
    return "\n".join(texts)  # vLLM joins a message's text parts so


def render_chat(
    template: ChatTemplate | None,
    messages: list[dict[str, Any]],
    model_name: str,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The prompt text of a conversation: ``template.render`` with the generation prompt (and
    ``tools``, as Hugging Face's ``apply_chat_template(tools=...)`` passes them).

    ChatRejected (400) when the model has no chat template (saying how to add one) or when the
    template refuses the conversation (its ChatTemplateError's message, shortened, naming the
    template's file without its directory)."""
    if template is None:
        raise ChatRejected(
            f"the model {model_name!r} has no chat template, so /v1/chat/completions cannot format a "
            "conversation for it; add a chat_template to its tokenizer_config.json or a "
            "chat_template.jinja file to its directory, or use /v1/completions (the bundled "
            "kael-tiny-chat model has one: kael-server --data kael-tiny-chat)"
        )
    import kael  # the template was loaded by kael, so kael is imported already

    try:
        return str(template.render(messages, add_generation_prompt=True, tools=tools or None))
    except kael.KaelError as exc:
        text = str(exc)
        source = template.name
        if source:  # the file's name, never the server's path to it
            text = text.replace(source, Path(source).name)
        if len(text) > _MAX_TEMPLATE_MESSAGE:
            text = text[:_MAX_TEMPLATE_MESSAGE] + "..."
        raise ChatRejected(text) from None
