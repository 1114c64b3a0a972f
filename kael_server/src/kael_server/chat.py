"""A chat request's conversation: its messages checked one by one, then rendered by the model's chat template.

Errors name the message and the field (``messages[1].content[0].type``) and say what was
expected; they never repeat the text of a message. The template runs in the sandbox of
``kael.tokenizer.ChatTemplate``; what it refuses (``raise_exception``, a role it does not
know) is the client's error, a 400 with the template's own message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kael_server.errors import ChatRejected, FieldError, InvalidRequest

__all__ = ["ROLES", "conversation", "render_chat"]

ROLES = ("system", "developer", "user", "assistant")
"""The roles a message may have; a developer message is rendered as a system message (OpenAI's
newer name for it)."""
_SHOWN = re.compile(r"^[a-z_]{1,32}$")
"""A part type short and plain enough to name in an error (``image_url``, ``input_audio``)."""
_MAX_TEMPLATE_MESSAGE = 500
"""Characters of a template's own error message passed on to the client."""


def conversation(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The messages as a chat template takes them (``role`` and a string ``content``); raises
    InvalidRequest listing every message that is not a text message of a known role."""
    errors: list[FieldError] = []
    out: list[dict[str, str]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role")
        if "role" not in message:
            errors.append(FieldError(f"{where}.role", "field required"))
        elif role not in ROLES:
            errors.append(
                FieldError(
                    f"{where}.role",
                    f"expected one of {', '.join(repr(r) for r in ROLES)} (kael serves text chat; "
                    "tool and function messages are not supported)",
                )
            )
        if "name" in message and not isinstance(message["name"], str):
            errors.append(FieldError(f"{where}.name", "expected a string"))
        content = _content(message, where, errors)
        if content is not None and isinstance(role, str) and role in ROLES:
            out.append({"role": "system" if role == "developer" else role, "content": content})
    if errors:
        raise InvalidRequest(errors)
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


def render_chat(template: Any, messages: list[dict[str, str]], model_name: str) -> str:
    """The prompt text of a conversation: ``template.render`` with the generation prompt.

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
        return str(template.render(messages, add_generation_prompt=True))
    except kael.KaelError as exc:
        text = str(exc)
        source = getattr(template, "name", None)
        if isinstance(source, str) and source:  # the file's name, never the server's path to it
            text = text.replace(source, Path(source).name)
        if len(text) > _MAX_TEMPLATE_MESSAGE:
            text = text[:_MAX_TEMPLATE_MESSAGE] + "..."
        raise ChatRejected(text) from None
