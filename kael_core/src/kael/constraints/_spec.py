"""Constraint specs: ``json_schema``, ``json_object``, ``regex``, ``choice`` and ``grammar``
build a ``Constraint`` (the grammar text the library compiles, and what it came from),
checking the limits first so that a hostile request never reaches the compiler."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .._errors import KaelError

__all__ = [
    "Constraint",
    "ConstraintError",
    "Limits",
    "choice",
    "grammar",
    "json_object",
    "json_schema",
    "regex",
]

Kind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]


class ConstraintError(KaelError, ValueError):
    """A constraint that cannot be built or compiled: names the field and the reason."""


@dataclass(frozen=True)
class Limits:
    """Size limits checked before compiling (all in bytes / levels / items)."""

    schema_bytes: int = 64 * 1024
    nesting_depth: int = 32
    grammar_bytes: int = 64 * 1024
    regex_bytes: int = 8 * 1024
    choices: int = 1024


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Constraint:
    """What a request's output must match: ``kind``, the field it came from (for errors) and
    ``text``, the llguidance grammar (a JSON grammar spec) it compiles to."""

    kind: Kind
    field: str
    text: str


def _depth(value: Any) -> int:
    """How many objects/arrays deep ``value`` nests (iterative: a hostile schema may nest deep)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, Mapping):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
        else:
            continue
        deepest = max(deepest, level + 1)
    return deepest


def _spec(field: str, body: Any, flexible_whitespace: bool) -> str:
    from llguidance import LLMatcher

    try:
        return LLMatcher.grammar_from_json_schema(dict(body), defaults={"whitespace_flexible": flexible_whitespace})
    except Exception as e:  # the library's own error types are not part of its API
        raise ConstraintError(f"{field}: invalid json schema ({e})") from None


def json_schema(
    schema: Mapping[str, Any] | str,
    *,
    field: str = "response_format.json_schema.schema",
    limits: Limits = DEFAULT_LIMITS,
    flexible_whitespace: bool = False,
) -> Constraint:
    """Output is JSON valid against ``schema`` (a dict or its JSON text). Separators are
    ``", "`` and ``": "`` with no other whitespace unless ``flexible_whitespace`` (a model can
    otherwise spend its tokens on whitespace; vLLM's ``disable-any-whitespace`` choice)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"{field}: not valid JSON ({e.msg} at position {e.pos})") from None
    if not isinstance(schema, Mapping):
        raise ConstraintError(f"{field}: a JSON schema must be an object, got {type(schema).__name__}")
    depth = _depth(schema)
    if depth > limits.nesting_depth:
        raise ConstraintError(f"{field}: schema nests {depth} levels deep, at most {limits.nesting_depth} allowed")
    try:
        text = json.dumps(schema, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ConstraintError(f"{field}: not JSON-serialisable ({e})") from None
    size = len(text.encode())
    if size > limits.schema_bytes:
        raise ConstraintError(f"{field}: schema is {size} bytes, at most {limits.schema_bytes} allowed")
    return Constraint("json_schema", field, _spec(field, schema, flexible_whitespace))


def json_object(*, field: str = "response_format", flexible_whitespace: bool = False) -> Constraint:
    """Output is any JSON object (OpenAI's ``{"type": "json_object"}``)."""
    return Constraint("json_object", field, _spec(field, {"type": "object"}, flexible_whitespace))


def regex(pattern: str, *, field: str = "regex", limits: Limits = DEFAULT_LIMITS) -> Constraint:
    r"""The whole output matches ``pattern`` (Rust ``regex`` syntax, as Python's for the
    common subset; no lookaround or backreferences). ``\d``, ``\w`` and ``\s`` are Unicode
    classes of the regex crate's Unicode version, which can be newer than Python's ``re``'s
    (Unicode 16's outlined digits U+1CCF0-U+1CCF9 are ``\d`` here, unknown to Python 3.11's
    ``re``): write ``[0-9]`` for ASCII digits."""
    if not isinstance(pattern, str):
        raise ConstraintError(f"{field}: a regex must be a string, got {type(pattern).__name__}")
    size = len(pattern.encode())
    if size > limits.regex_bytes:
        raise ConstraintError(f"{field}: regex is {size} bytes, at most {limits.regex_bytes} allowed")
    from llguidance import LLMatcher

    return Constraint("regex", field, LLMatcher.grammar_from_regex(pattern))


def _literal(text: str) -> str:
    """A regex matching exactly ``text``: every non-alphanumeric character as ``\\x{..}``."""
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):x}}}" for c in text)


def choice(options: Sequence[str], *, field: str = "choice", limits: Limits = DEFAULT_LIMITS) -> Constraint:
    """Output is exactly one of ``options`` (vLLM's ``guided_choice``)."""
    if isinstance(options, str) or not isinstance(options, Sequence) or not options:
        raise ConstraintError(f"{field}: expected a non-empty list of strings")
    if len(options) > limits.choices:
        raise ConstraintError(f"{field}: {len(options)} choices, at most {limits.choices} allowed")
    for i, o in enumerate(options):
        if not isinstance(o, str):
            raise ConstraintError(f"{field}[{i}]: expected a string, got {type(o).__name__}")
    alternation = "|".join(_literal(o) for o in dict.fromkeys(options))
    from llguidance import LLMatcher

    return Constraint("choice", field, LLMatcher.grammar_from_regex(f"({alternation})"))


def grammar(text: str, *, field: str = "grammar", limits: Limits = DEFAULT_LIMITS) -> Constraint:
    """Output matches a Lark grammar (llguidance's dialect: ``start:`` rule, ``/regex/``
    terminals, ``%json {...}`` embedded schemas) or a GBNF grammar (``root ::= ...``,
    llama.cpp's), converted to Lark."""
    if not isinstance(text, str) or not text.strip():
        raise ConstraintError(f"{field}: expected a non-empty grammar string")
    size = len(text.encode())
    if size > limits.grammar_bytes:
        raise ConstraintError(f"{field}: grammar is {size} bytes, at most {limits.grammar_bytes} allowed")
    if "::=" in text:
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            text = gbnf_to_lark(text)
        except Exception as e:  # the converter raises plain exceptions on bad GBNF
            raise ConstraintError(f"{field}: invalid GBNF grammar ({e})") from None
    from llguidance import LLMatcher

    return Constraint("grammar", field, LLMatcher.grammar_from_lark(text))
