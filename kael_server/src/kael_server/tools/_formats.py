"""Tool-call output formats: which one a chat template uses, and how a (possibly partial)
model output splits into plain content and tool calls in each.

- ``hermes`` (Hermes 2 Pro, Qwen2.5, Qwen3): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
  per call; content is the text before the first ``<tool_call>``.
- ``llama3_json`` (Llama 3.1-3.3 JSON tool calling): the whole reply is
  ``{"name": ..., "parameters": {...}}`` (``;``-separated when several), optionally after
  ``<|python_tag|>``.
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (v3 tokenizers) or
  ``[TOOL_CALLS]name[ARGS]{...}`` per call (v11+).
- ``json`` (generic; what a ``tool_choice`` grammar produces): one object or a list of objects
  with ``name`` and ``arguments``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ._scan import ScannedObject, scan_object, scan_value

__all__ = ["Format", "PartialCall", "Split", "detect_format", "split_output"]

Format = Literal["hermes", "llama3_json", "mistral", "json"]

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"


@dataclass
class PartialCall:
    """A tool call as far as it is written: its name (None until complete), the raw text of
    its arguments so far, and whether the arguments / the whole call are complete."""

    name: str | None
    args_raw: str
    args_complete: bool
    complete: bool


@dataclass
class Split:
    """A model output split: ``content`` (text that is surely not a tool call; a trailing
    piece that may begin a marker is held back) and the calls."""

    content: str
    calls: list[PartialCall]


def detect_format(template: str) -> Format:
    """The tool-call format a chat template's text asks the model for (``json`` if none)."""
    if HERMES_OPEN in template:
        return "hermes"
    if MISTRAL_CALLS in template:
        return "mistral"
    if PYTHON_TAG in template or ('"parameters"' in template and "<|eot_id|>" in template):
        return "llama3_json"
    return "json"


def _held_back(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _call(obj: ScannedObject, *, name: str | None = None) -> PartialCall:
    if name is None:
        raw_name = obj.fields.get("name")
        name = obj.value("name") if raw_name is not None and raw_name.complete else None  # type: ignore[assignment]
        if name is not None and not isinstance(name, str):
            name = None
    args = obj.fields.get("arguments") or obj.fields.get("parameters")
    return PartialCall(
        name,
        args.raw if args is not None else "",
        args is not None and args.complete,
        obj.end is not None,
    )


def _objects(text: str, i: int, sep: str) -> list[ScannedObject]:
    """The objects from ``text[i]`` on, separated by ``sep`` characters / whitespace."""
    out: list[ScannedObject] = []
    while i < len(text):
        c = text[i]
        if c in sep or c.isspace():
            i += 1
            continue
        if c != "{":
            break
        obj = scan_object(text, i)
        out.append(obj)
        if obj.end is None:
            break
        i = obj.end
    return out


def _hermes(text: str) -> Split:
    first = text.find(HERMES_OPEN)
    if first < 0:
        return Split(text[: len(text) - _held_back(text, HERMES_OPEN)], [])
    calls = []
    for body in text[first:].split(HERMES_OPEN)[1:]:
        start = body.find("{")
        if start >= 0:
            calls.append(_call(scan_object(body, start)))
    return Split(text[:first], calls)


def _json_start(text: str, prefix: str) -> tuple[int, bool] | None:
    """(index of the first JSON character, decided) for formats whose whole reply is JSON;
    None when the reply is plain content."""
    i = len(text) - len(text.lstrip())
    if text.startswith(prefix, i) and prefix:
        i += len(prefix)
        i += len(text[i:]) - len(text[i:].lstrip())
    rest = text[i:]
    if not rest:
        return i, False
    if prefix and prefix.startswith(rest):
        return i, False
    return (i, True) if rest[0] in "{[" else None


def _whole_json(text: str, prefix: str, sep: str) -> Split:
    start = _json_start(text, prefix)
    if start is None:
        return Split(text, [])
    i, _ = start
    if i < len(text) and text[i] == "[":
        i += 1
    return Split("", [_call(o) for o in _objects(text, i, sep)])


def _mistral(text: str) -> Split:
    first = text.find(MISTRAL_CALLS)
    if first < 0:
        return Split(text[: len(text) - _held_back(text, MISTRAL_CALLS)], [])
    rest = text[first + len(MISTRAL_CALLS) :].lstrip()
    if rest.startswith("["):
        return Split(text[:first], [_call(o) for o in _objects(rest, 1, ",")])
    calls = []
    for part in rest.split(MISTRAL_CALLS):
        name, sep, args = part.partition(MISTRAL_ARGS)
        if not sep:
            continue
        j = len(args) - len(args.lstrip())
        end = scan_value(args, j)
        calls.append(PartialCall(name.strip(), args[j:end] if end else args[j:], end is not None, end is not None))
    return Split(text[:first], calls)


def split_output(text: str, fmt: Format) -> Split:
    """Split a (possibly partial) model output in format ``fmt``."""
    if fmt == "hermes":
        return _hermes(text)
    if fmt == "mistral":
        return _mistral(text)
    if fmt == "llama3_json":
        return _whole_json(text, PYTHON_TAG, ";,")
    return _whole_json(text, "", ",")
