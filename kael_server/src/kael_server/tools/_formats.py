"""Tool-call output formats: which one a chat template uses, and how a (possibly partial)
model output splits into plain content and tool calls in each.

- ``hermes`` (Hermes 2 Pro, Qwen2.5, Qwen3): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
  per call (a call without ``arguments`` calls with ``{}``).
- ``llama3_json`` (Llama 3.1-3.3 JSON tool calling): the whole reply is
  ``{"name": ..., "parameters": {...}}`` (``;``-separated when several), optionally after
  ``<|python_tag|>``.
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (v3 tokenizers; a call
  without ``arguments`` calls with ``{}``) or ``[TOOL_CALLS]name[ARGS]{...}`` per call (v11+).
- ``json`` (generic; what a ``tool_choice`` grammar produces): one object or a list of objects
  with ``name`` and ``arguments``.

Content is all the text outside the calls, in order: before the first call and, where a model
writes any, between and after finished calls (never dropped; transformers' response parser keeps
text after calls too).
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


def _held_back(text: str, marker: str, hold: bool = True) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker`` (0 when
    not ``hold``ing: the output is finished)."""
    if not hold:
        return 0
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _call(obj: ScannedObject, *, name: str | None = None, default_args: bool = False) -> PartialCall:
    """A call from a scanned ``{"name": ..., "arguments"|"parameters": ...}`` object; with
    ``default_args`` a finished object without arguments calls with ``{}``."""
    if name is None:
        raw_name = obj.fields.get("name")
        name = obj.value("name") if raw_name is not None and raw_name.complete else None  # type: ignore[assignment]
        if name is not None and not isinstance(name, str):
            name = None
    args = obj.fields.get("arguments") or obj.fields.get("parameters")
    if args is None and default_args and obj.end is not None:
        return PartialCall(name, "{}", True, True)
    return PartialCall(
        name,
        args.raw if args is not None else "",
        args is not None and args.complete,
        obj.end is not None,
    )


def _objects(text: str, i: int, sep: str) -> tuple[list[ScannedObject], int]:
    """The objects from ``text[i]`` on, separated by ``sep`` characters / whitespace, and the
    index where they stop (past the last complete object and the separators after it)."""
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
    return out, i


def _after_objects(text: str, objs: list[ScannedObject], stop: int) -> str:
    """Plain text after the last finished object (from its end on), once something that is
    neither a separator nor another object has begun; "" while the calls may go on."""
    if not objs or objs[-1].end is None or stop >= len(text):
        return ""
    return text[objs[-1].end :]


def _hermes(text: str, hold: bool) -> Split:
    i = text.find(HERMES_OPEN)
    if i < 0:
        return Split(text[: len(text) - _held_back(text, HERMES_OPEN, hold)], [])
    content, calls = text[:i], []
    while i >= 0:
        start = text.find("{", i + len(HERMES_OPEN))
        if start < 0:
            break
        obj = scan_object(text, start)
        calls.append(_call(obj, default_args=True))
        close = text.find(HERMES_CLOSE, obj.end) if obj.end is not None else -1
        if close < 0:
            break
        k = close + len(HERMES_CLOSE)
        i = text.find(HERMES_OPEN, k)
        # text after a closed call (up to the next one) is content
        content += text[k:i] if i >= 0 else text[k : len(text) - _held_back(text[k:], HERMES_OPEN, hold)]
    return Split(content, calls)


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
    is_list = i < len(text) and text[i] == "["
    objs, stop = _objects(text, i + 1 if is_list else i, sep)
    if is_list:
        return Split(_after_list(text, objs, stop), [_call(o) for o in objs])
    return Split(_after_objects(text, objs, stop), [_call(o) for o in objs])


def _after_list(text: str, objs: list[ScannedObject], stop: int) -> str:
    """Plain text after a ``[...]`` list of calls (its ``]`` at ``text[stop]``)."""
    if objs and objs[-1].end is not None and stop < len(text) and text[stop] == "]":
        return text[stop + 1 :]
    return ""


def _mistral_v11(text: str, i: int, hold: bool) -> Split:
    """``[TOOL_CALLS]name[ARGS]{...}`` per call from ``text[i]`` (at a marker) on; text between
    and after calls is content."""
    content, calls = "", []
    while i >= 0:
        j = i + len(MISTRAL_CALLS)
        args_at = text.find(MISTRAL_ARGS, j)
        if args_at < 0:
            break  # the name is still being written
        a = args_at + len(MISTRAL_ARGS)
        a += len(text[a:]) - len(text[a:].lstrip())
        end = scan_value(text, a)
        calls.append(
            PartialCall(text[j:args_at].strip(), text[a:end] if end else text[a:], end is not None, end is not None)
        )
        if end is None:
            break
        i = text.find(MISTRAL_CALLS, end)
        between = text[end:] if i < 0 else text[end:i]
        content += between[: len(between) - _held_back(between, MISTRAL_CALLS, hold)] if i < 0 else between
    return Split(content, calls)


def _mistral(text: str, hold: bool) -> Split:
    first = text.find(MISTRAL_CALLS)
    if first < 0:
        return Split(text[: len(text) - _held_back(text, MISTRAL_CALLS, hold)], [])
    rest = text[first + len(MISTRAL_CALLS) :].lstrip()
    if rest.startswith("["):
        objs, stop = _objects(rest, 1, ",")
        return Split(text[:first] + _after_list(rest, objs, stop), [_call(o, default_args=True) for o in objs])
    split = _mistral_v11(text, first, hold)
    return Split(text[:first] + split.content, split.calls)


def split_output(text: str, fmt: Format, *, final: bool = False) -> Split:
    """Split a (possibly partial) model output in format ``fmt``; ``final``: the output is
    finished, nothing is held back."""
    if fmt == "hermes":
        return _hermes(text, not final)
    if fmt == "mistral":
        return _mistral(text, not final)
    if fmt == "llama3_json":
        return _whole_json(text, PYTHON_TAG, ";,")
    return _whole_json(text, "", ",")
