"""``tool_choice: "auto"`` as a constraint: the model may answer in free text or open a tool
call in its template's format; once it has opened one, the rest of the call is generated under
the tools' schemas, so a call never fails to parse or to validate.

One llguidance Lark grammar per request, by format (``_formats``):

- ``hermes``: free text, then optionally ``<tool_call>\\n{call}\\n</tool_call>`` (one or more);
- ``mistral``: free text, then optionally ``[TOOL_CALLS]`` and a JSON list of calls (v3), or
  ``[TOOL_CALLS]name[ARGS]{arguments}`` per call when the template writes ``[ARGS]`` (v11+);
- ``llama3_json``: a reply that is free text (not starting with ``{``), or the calls
  (``;``-separated), optionally after ``<|python_tag|>``;
- ``json``: free text (not starting with ``{`` or ``[``), or one call or a list of calls.

A marker that is one of the tokenizer's special tokens is referenced by its id (``<[id]>``), so
the model writes it as that token, as it was trained to; a marker written as text ends the free
text lazily (a lexeme with a ``suffix``), so free text never holds a marker without opening a
call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ._formats import HERMES_CLOSE, HERMES_OPEN, MISTRAL_ARGS, MISTRAL_CALLS, PYTHON_TAG, Format

__all__ = ["auto_grammar"]

_ANY = "/(?s:.*)/"
_WS = "/[ \\t\\r\\n]*/"


def _call(tool: Mapping[str, Any], args_key: str) -> dict[str, Any]:
    fn = tool["function"]
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": fn["name"]}, args_key: dict(params)},
        "required": ["name", args_key],
        "additionalProperties": False,
    }


def _one_of(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


_LAYOUT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
"""JSON written as models write it (``", "`` and ``": "``, no other whitespace), as
``kael.constraints.json_schema`` does: a small model can otherwise spend its tokens on spaces."""


def _json(schema: Mapping[str, Any]) -> str:
    """A ``%json`` body: ``schema`` with the layout above (llguidance's ``x-guidance`` options)."""
    return json.dumps({**schema, "x-guidance": _LAYOUT})


def _lit(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text)


def _marker(text: str, special: Mapping[str, int]) -> tuple[str, bool]:
    """(the grammar's reference to marker ``text``, whether it is a special token)."""
    if text in special:
        return f"<[{int(special[text])}]>", True
    return _lit(text), False


def _opened(marker: str, body: str, special: Mapping[str, int]) -> list[str]:
    """Rules: ``start`` is free text, or free text then ``marker`` then ``body`` (a rule name)."""
    ref, is_special = _marker(marker, special)
    without = f"~/(?s:.*{_escape(marker)}.*)/"  # nor the marker spelled out in plain tokens
    if is_special:  # free text cannot hold a special token: a greedy lexeme ends before it
        return [f"start: TEXT | TEXT? {ref} {body}", f"TEXT: /(?s:.+)/ & {without}"]
    return [f"start: TEXT | prefix {body}", f"prefix[suffix={ref}]: {_ANY}", f"TEXT: {_ANY} & {without}"]


def _hermes(tools: Sequence[Mapping[str, Any]], parallel: bool, special: Mapping[str, int]) -> list[str]:
    call = _json(_one_of([_call(t, "arguments") for t in tools]))
    close = _lit(HERMES_CLOSE)
    rules = _opened(HERMES_OPEN, "calls", special)
    more = f" ({_WS} {_marker(HERMES_OPEN, special)[0]} call)*" if parallel else ""
    rules += [f"calls: call{more} {_WS}", f'call: "\\n" %json {call} "\\n" {close}']
    return rules


def _mistral(
    tools: Sequence[Mapping[str, Any]], parallel: bool, special: Mapping[str, int], template: str
) -> list[str]:
    if MISTRAL_ARGS in template:  # v11+: [TOOL_CALLS]name[ARGS]{...} per call
        opener, _ = _marker(MISTRAL_CALLS, special)
        args, _ = _marker(MISTRAL_ARGS, special)
        alts = " | ".join(
            f"{_lit(t['function']['name'])} {args} %json {_json(t['function'].get('parameters') or {'type': 'object'})}"
            for t in tools
        )
        rules = _opened(MISTRAL_CALLS, "calls", special)
        more = f" ({opener} call)*" if parallel else ""
        return [*rules, f"calls: call{more}", f"call: {alts}"]
    items = _one_of([_call(t, "arguments") for t in tools])
    array = {"type": "array", "items": items, "minItems": 1, **({} if parallel else {"maxItems": 1})}
    return [*_opened(MISTRAL_CALLS, "calls", special), f"calls: %json {_json(array)}"]


def _whole_reply(
    tools: Sequence[Mapping[str, Any]], parallel: bool, special: Mapping[str, int], fmt: Format
) -> list[str]:
    key = "parameters" if fmt == "llama3_json" else "arguments"
    call = _one_of([_call(t, key) for t in tools])
    # plain content is a reply whose first non-space character opens no JSON (the parser skips
    # leading whitespace, and a Llama reply may begin with <|python_tag|>)
    text = "TEXT: /[ \\t\\r\\n]*[^{\\[ \\t\\r\\n](?s:.*)/"
    if fmt == "json":
        array = {"type": "array", "items": call, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        return ["start: TEXT | calls", f"calls: %json {_json(_one_of([call, array]))}", text]
    ref, _ = _marker(PYTHON_TAG, special)
    more = ' (";" /[ ]?/ call)*' if parallel else ""
    text += f" & ~/[ \\t\\r\\n]*{_escape(PYTHON_TAG)}(?s:.*)/"
    return [f"start: TEXT | calls | {ref} calls", f"calls: call{more}", f"call: %json {_json(call)}", text]


def _escape(text: str) -> str:
    return "".join(f"\\x{{{ord(c):x}}}" for c in text)


def auto_grammar(
    tools: Sequence[Mapping[str, Any]],
    fmt: Format,
    *,
    parallel: bool = True,
    special_tokens: Mapping[str, int] | None = None,
    template: str = "",
) -> str:
    """The Lark grammar (llguidance's dialect) of a reply to ``tools`` with ``tool_choice``
    "auto" in format ``fmt``: free text, or tool calls whose arguments match the tools'
    schemas (one call unless ``parallel``). ``special_tokens``: the served tokenizer's special
    tokens by text (markers among them are referenced by id); ``template``: the chat
    template's source (tells Mistral's two call syntaxes apart)."""
    special = special_tokens or {}
    if fmt == "hermes":
        rules = _hermes(tools, parallel, special)
    elif fmt == "mistral":
        rules = _mistral(tools, parallel, special, template)
    else:
        rules = _whole_reply(tools, parallel, special, fmt)
    return "\n".join(rules) + "\n"
