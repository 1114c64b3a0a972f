"""A chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``: checked, and turned
into what the reply needs: the tools for the chat template, the format its output is parsed in
(``kael_server.tools``), and the constraint ``"required"`` or a named function generates under.

- ``"none"``: the tools are rendered (as vLLM does) but the output is never parsed for calls;
- ``"auto"`` (the default with tools): the output is parsed in the template's own format
  (``detect_format``: Hermes/Qwen ``<tool_call>``, Llama 3.1 JSON, Mistral ``[TOOL_CALLS]``, or
  the generic JSON one) and generated under ``auto_grammar``: free text, but once the model
  opens a call the rest of it follows the tools' schemas. When the request also constrains its
  output (``response_format``, ...), that constraint governs the whole reply instead, so no
  call can be opened (the reply is parsed all the same);
- ``"required"`` / a named function: the output is generated under a grammar of the tools'
  schemas (``tool_choice_constraint``), in the generic JSON format, so every call parses and
  its arguments validate; ``parallel_tool_calls: false`` allows exactly one call.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kael.constraints import Constraint, ConstraintError, grammar, json_schema

from kael_server.errors import FieldError, InvalidRequest
from kael_server.protocols import ChatTemplate
from kael_server.structured import LIMITS, refusal
from kael_server.tools import Format, auto_grammar, detect_format, tool_choice_constraint

__all__ = ["ToolRequest", "tool_request"]

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""OpenAI's rule for a function's name."""


@dataclass(frozen=True)
class ToolRequest:
    """What a chat request's tool fields mean for its reply."""

    tools: list[dict[str, Any]] | None
    """The tools as the chat template gets them (None: no tools)."""
    fmt: Format | None
    """The format the output is parsed in for tool calls (None: not parsed)."""
    constraint: tuple[str, Constraint] | None
    """The tool-call grammar and the field that asked for it (``tool_choice``)."""
    auto: bool = False
    """Whether ``constraint`` is the "auto" one (which yields to another constraint field)."""


def _check_tools(tools: list[dict[str, Any]]) -> list[FieldError]:
    errors = []
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if tool.get("type") != "function":
            errors.append(FieldError(f"{at}.type", "expected 'function'"))
            continue
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            errors.append(FieldError(f"{at}.function", 'expected {"name": ..., "parameters": {...}}'))
            continue
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            errors.append(FieldError(f"{at}.function.name", "expected 1 to 64 letters, digits, '_' or '-'"))
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            errors.append(FieldError(f"{at}.function.description", "expected a string"))
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], Mapping):
            errors.append(FieldError(f"{at}.function.parameters", "expected a JSON schema (an object)"))
    names = [t["function"].get("name") for t in tools if isinstance(t.get("function"), Mapping)]
    dupes = sorted({n for n in names if isinstance(n, str) and names.count(n) > 1})
    if dupes:
        errors.append(FieldError("tools", f"expected distinct function names, got {dupes[0]!r} twice"))
    return errors


def _choice(value: Any) -> str | dict[str, Any]:
    if value in (None, "none", "auto", "required"):
        return value or "auto"
    fn = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InvalidRequest(
            [FieldError("tool_choice", '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}')]
        )
    return value  # type: ignore[no-any-return]


def tool_request(
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    parallel: bool | None,
    template: ChatTemplate | None,
    special_tokens: Mapping[str, int] | None = None,
) -> ToolRequest:
    """The reply's view of a request's tool fields; InvalidRequest naming the field.
    ``special_tokens``: the served tokenizer's (a call marker among them is generated as it)."""
    choice = _choice(tool_choice)
    if not tools:
        if choice not in ("auto", "none"):
            raise InvalidRequest([FieldError("tool_choice", "expected 'none' or 'auto' without tools")])
        return ToolRequest(None, None, None)
    errors = _check_tools(tools)
    if errors:
        raise InvalidRequest(errors)
    if choice == "none":
        return ToolRequest(tools, None, None)
    source = template.source if template is not None else ""
    if choice == "auto":
        fmt = detect_format(source)
        for i, tool in enumerate(tools):  # each schema's size, depth and support, by its field
            params = tool["function"].get("parameters")
            if params is not None:
                try:
                    json_schema(params, field=f"tools[{i}].function.parameters", limits=LIMITS)
                except ConstraintError as exc:
                    raise InvalidRequest([refusal(exc, "tools")]) from None
        text = auto_grammar(tools, fmt, parallel=parallel is not False, special_tokens=special_tokens, template=source)
        try:
            return ToolRequest(tools, fmt, ("tools", grammar(text, field="tools", limits=LIMITS)), auto=True)
        except ConstraintError as exc:
            raise InvalidRequest([refusal(exc, "tools")]) from None
    try:
        c = tool_choice_constraint(tools, choice, parallel=parallel is not False, limits=LIMITS)
    except ConstraintError as exc:
        raise InvalidRequest([refusal(exc, "tools")]) from None
    assert c is not None  # "required" or a named function
    return ToolRequest(tools, "json", ("tool_choice", c))
