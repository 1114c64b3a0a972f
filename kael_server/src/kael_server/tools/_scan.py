"""A scanner for possibly incomplete JSON objects, as a model writes them token by token:
the raw text of each top-level field's value so far and whether it is complete."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

__all__ = ["Field", "ScannedObject", "scan_object", "scan_value"]

_WS = " \t\r\n"


@dataclass
class Field:
    """One top-level field: the raw value text so far and whether the value is complete."""

    raw: str
    complete: bool


@dataclass
class ScannedObject:
    """A (possibly partial) object: its fields and the index just past its ``}`` (None
    while open)."""

    fields: dict[str, Field] = field(default_factory=dict)
    end: int | None = None

    def value(self, key: str) -> object:
        """The parsed value of a complete field (``None`` when absent or incomplete)."""
        f = self.fields.get(key)
        return json.loads(f.raw) if f is not None and f.complete else None


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _string_end(text: str, i: int) -> int | None:
    """Index past the closing quote of the string opening at ``text[i]``."""
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        j += 1
    return None


def scan_value(text: str, i: int) -> int | None:
    """Index past the JSON value starting at ``text[i]``; None if it is not complete yet."""
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        return _string_end(text, i)
    if c in "{[":
        depth, j = 0, i
        while j < len(text):
            ch = text[j]
            if ch == '"':
                e = _string_end(text, j)
                if e is None:
                    return None
                j = e
                continue
            if ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    j = i
    while j < len(text) and text[j] not in ",}] \t\r\n":
        j += 1
    return j if j < len(text) else None


def scan_object(text: str, i: int) -> ScannedObject:
    """Scan the object whose ``{`` is at ``text[i]``."""
    obj = ScannedObject()
    j = _skip(text, i + 1)
    while j < len(text):
        if text[j] == "}":
            obj.end = j + 1
            return obj
        if text[j] == ",":
            j = _skip(text, j + 1)
            continue
        if text[j] != '"':
            return obj  # not JSON: left open, the caller sees no end
        k_end = _string_end(text, j)
        if k_end is None:
            return obj
        key = json.loads(text[j:k_end])
        j = _skip(text, k_end)
        if j >= len(text) or text[j] != ":":
            return obj
        j = _skip(text, j + 1)
        v_end = scan_value(text, j)
        if v_end is None:
            obj.fields[key] = Field(text[j:], False)
            return obj
        obj.fields[key] = Field(text[j:v_end], True)
        j = _skip(text, v_end)
    return obj
