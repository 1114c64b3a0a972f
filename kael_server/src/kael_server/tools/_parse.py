"""Non-streaming tool-call parsing: a finished model output -> OpenAI ``content`` and
``tool_calls`` (``id``, ``type: function``, ``function.name``, ``function.arguments`` as a JSON
string). An output whose calls do not parse is plain content, as vLLM's parsers do."""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._formats import Format, split_output

__all__ = ["ParsedTurn", "decode_arguments", "new_call_id", "parse_tool_calls"]

_ALNUM = string.ascii_letters + string.digits


def new_call_id(fmt: Format = "json") -> str:
    """A fresh call id: ``call_`` + 24 alphanumerics (OpenAI's shape); Mistral's templates
    require exactly 9 alphanumerics."""
    n = 9 if fmt == "mistral" else 24
    body = "".join(secrets.choice(_ALNUM) for _ in range(n))
    return body if fmt == "mistral" else f"call_{body}"


@dataclass
class ParsedTurn:
    """An assistant turn: ``content`` (None when empty) and OpenAI ``tool_calls``."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def decode_arguments(raw: str) -> object:
    """The arguments a call's raw JSON text holds: the value, or, when a model writes the
    arguments as a JSON string holding an object (``"arguments": "{\\"a\\": 1}"``, as some
    fine-tunes do), that object; None when the text does not parse."""
    try:
        value = json.loads(raw)
        if isinstance(value, str) and value.lstrip().startswith("{"):
            value = json.loads(value)
    except json.JSONDecodeError:
        return None
    return value


def parse_tool_calls(text: str, fmt: Format, id_factory: Callable[[Format], str] = new_call_id) -> ParsedTurn:
    """Parse a finished output; no tool calls (the whole text as content) if any call is
    incomplete, unnamed or has arguments that are not a JSON object (or a JSON string holding
    one). The content is the text outside the calls, stripped."""
    s = split_output(text, fmt, final=True)
    calls = []
    for c in s.calls:
        if not (c.complete and c.name and c.args_complete):
            return ParsedTurn(text or None)
        args = decode_arguments(c.args_raw)
        if not isinstance(args, dict):
            return ParsedTurn(text or None)
        calls.append(
            {
                "id": id_factory(fmt),
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
        )
    if not calls:
        return ParsedTurn(text or None)
    content = s.content.strip()
    return ParsedTurn(content or None, calls)
