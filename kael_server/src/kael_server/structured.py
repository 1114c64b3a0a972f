"""Structured outputs of the OpenAI routes: the request fields that constrain what is generated,
parsed once into one ``kael.constraints.Constraint`` (``SamplingParams.constraint``).

The fields, by the API that named them:

- OpenAI: ``response_format`` ``{"type": "text"}``, ``{"type": "json_object"}`` and
  ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`` (kael always
  enforces the schema: ``strict`` false is not looser);
- vLLM: ``structured_outputs`` with one of ``json`` (a schema, or its JSON text), ``regex``,
  ``choice``, ``grammar`` (Lark or GBNF), ``json_object``; and the older top-level
  ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``;
- llama.cpp: ``json_schema`` (a schema) and ``grammar`` (GBNF); its ``response_format``
  ``{"type": "json_object", "schema": {...}}`` too.

Constraints never fail open (DESIGN.md, "The engine"): a constraint the library refuses, one
over the server's limits (``LIMITS``), or two constraint fields in one request are a 400
naming the field (``param``) and the reason, checked before anything is generated, compiled
against the served tokenizer (``check_compiles``: the compiled grammar is cached by its text,
so the worker's own copy is a cache hit).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from kael.constraints import Constraint, ConstraintError, ConstraintMatcher, Limits, json_object, json_schema, regex
from kael.constraints import choice as choice_constraint
from kael.constraints import grammar as grammar_constraint
from kael.engine import SamplingParamError

from kael_server.errors import FieldError, InvalidRequest
from kael_server.metrics import Metrics

__all__ = ["CONSTRAINT_FIELDS", "LIMITS", "check_compiles", "constrained", "constraint_of", "has_constraint", "refusal"]

LIMITS = Limits(schema_bytes=1 << 20, nesting_depth=32, grammar_bytes=1 << 20, regex_bytes=16 << 10, choices=1024)
"""The server's limits on a constraint: 1 MiB of schema or grammar text, 32 levels of nesting,
16 KiB of regex, 1024 choices."""

CONSTRAINT_FIELDS = (
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "json_schema",
    "grammar",
)
"""The request fields that constrain the output (at most one per request)."""

_FIELD_PATH = re.compile(r"^[a-z_]+(\.[a-z_]+|\[[0-9]+\])*$")
"""A request field's path as errors name it (``tools[0].function.parameters``)."""
_STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")
_STRUCTURED_INERT = ("backend", "disable_fallback", "disable_additional_properties", "disable_any_whitespace")
"""vLLM's structured_outputs options that change nothing here: kael has one library and never
falls back; its JSON has no free whitespace; ``disable_additional_properties`` is kael's only
when the schema says so (accepted when false or absent)."""


def has_constraint(body: Any) -> bool:
    """Whether a decoded request names a field that may constrain its output (one of
    ``CONSTRAINT_FIELDS`` or ``tools``): its reply compiles a grammar."""
    return any(getattr(body, name, None) is not None for name in (*CONSTRAINT_FIELDS, "tools"))


def refusal(exc: ConstraintError, field: str) -> FieldError:
    """A ConstraintError as a client error: its message reads ``"<field path>: <reason>"``
    (else the whole message is the reason for ``field``)."""
    loc, sep, reason = str(exc).partition(": ")
    if not sep or not _FIELD_PATH.match(loc):
        return FieldError(field, str(exc))
    return FieldError(loc, reason)


def _response_format(value: Mapping[str, Any]) -> Constraint | None:
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = value.get("schema")  # llama.cpp's extension: a json_object with a schema
        if schema is not None:
            return json_schema(schema, field="response_format.schema", limits=LIMITS)
        return json_object(field="response_format")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping):
            raise ConstraintError('response_format.json_schema: expected an object {"name", "schema", "strict"}')
        name = spec.get("name")
        if name is not None and not isinstance(name, str):
            raise ConstraintError("response_format.json_schema.name: expected a string")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ConstraintError("response_format.json_schema.strict: expected true, false or null")
        schema = spec.get("schema", {})  # OpenAI: without a schema, any JSON value
        return json_schema(schema, field="response_format.json_schema.schema", limits=LIMITS)
    raise ConstraintError("response_format.type: expected 'text', 'json_object' or 'json_schema'")


def _structured(value: Mapping[str, Any]) -> Constraint | None:
    unknown = sorted(k for k in value if k not in _STRUCTURED_KEYS and k not in _STRUCTURED_INERT)
    if unknown:  # another kind of constraint (structural_tag, ...): refused, never ignored
        name = unknown[0] if _FIELD_PATH.match(unknown[0]) else "?"
        raise ConstraintError(f"structured_outputs.{name}: not supported (kael takes {', '.join(_STRUCTURED_KEYS)})")
    if value.get("disable_any_whitespace") is False or value.get("disable_additional_properties") is True:
        key = (
            "disable_any_whitespace"
            if value.get("disable_any_whitespace") is False
            else "disable_additional_properties"
        )
        raise ConstraintError(
            f"structured_outputs.{key}: not supported (kael's JSON has no free whitespace and keeps the schema as given)"
        )
    given = [k for k in _STRUCTURED_KEYS if value.get(k) not in (None, False)]
    if len(given) > 1:
        raise ConstraintError(f"structured_outputs: expected one of {', '.join(_STRUCTURED_KEYS)}, got {given}")
    if not given:
        return None
    key = given[0]
    return _one(f"structured_outputs.{key}", key, value[key])


def _one(field: str, kind: str, value: Any) -> Constraint:
    """The constraint of one field holding a constraint of ``kind``."""
    if kind in ("json", "json_schema"):
        return json_schema(value, field=field, limits=LIMITS)
    if kind == "json_object":
        return json_object(field=field)
    if kind == "regex":
        return regex(value, field=field, limits=LIMITS)
    if kind == "choice":
        return choice_constraint(value, field=field, limits=LIMITS)
    return grammar_constraint(value, field=field, limits=LIMITS)


_TOP_LEVEL = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
    "json_schema": "json_schema",
    "grammar": "grammar",
}


def constraint_of(
    body: Any, extra: tuple[str, Constraint] | None = None, *, extra_yields: bool = False
) -> Constraint | None:
    """The one constraint of a decoded request (None without one): ``extra`` is another
    constraint the request makes (``tools`` with ``tool_choice`` "required" or named, or the
    "auto" tool grammar, which ``extra_yields`` to a constraint field of the body), by the
    field that made it. Raises InvalidRequest naming the field and the reason, or every
    field when more than one constrains the output."""
    found: list[tuple[str, Constraint]] = []
    errors: list[FieldError] = []
    for name in CONSTRAINT_FIELDS:
        value = getattr(body, name, None)
        if value is None:
            continue
        try:
            if name == "response_format":
                c = _response_format(value)
            elif name == "structured_outputs":
                c = _structured(value)
            else:
                c = _one(name, _TOP_LEVEL[name], value)
        except ConstraintError as exc:
            errors.append(refusal(exc, name))
            continue
        if c is not None:
            found.append((name, c))
    if errors:
        raise InvalidRequest(errors)
    if extra is not None and not (extra_yields and found):
        found.append(extra)
    if len(found) > 1:
        names = [n for n, _ in found]
        raise InvalidRequest([FieldError(names[0], f"only one constraint per request, got {' and '.join(names)}")])
    return found[0][1] if found else None


def check_compiles(constraint: Constraint, tokenizer: Any, end_tokens: tuple[int, ...], metrics: Metrics) -> None:
    """Compiles ``constraint`` against the served vocabulary now (so no compile error reaches a
    worker), recording the compile time or the cache hit; InvalidRequest naming the field."""
    try:
        matcher = ConstraintMatcher(constraint, tokenizer, sorted(set(end_tokens)))
    except ConstraintError as exc:
        metrics.constraint_refused("compile")
        raise InvalidRequest([refusal(exc, constraint.field)]) from None
    except Exception as exc:  # the library's own exception types are not part of its API
        metrics.constraint_refused("compile")
        reason = f"the grammar library refused it ({type(exc).__name__}: {str(exc)[:200]})"
        raise InvalidRequest([FieldError(constraint.field, reason)]) from None
    metrics.constraint_compiled(matcher.compile_seconds, matcher.cache_hit)


def constrained(
    params: Any, body: Any, generator: Any, extra: tuple[str, Constraint] | None = None, *, extra_yields: bool = False
) -> Any:
    """``params`` with the request's constraint (``constraint_of``), compiled now against the
    served tokenizer and its end tokens (``check_compiles``); a refusal is an InvalidRequest
    (counted in ``kael_constraint_refusals``)."""
    try:
        c = constraint_of(body, extra, extra_yields=extra_yields)
    except InvalidRequest:
        generator.metrics.constraint_refused("invalid")
        raise
    if c is None:
        return params
    try:
        params = dataclasses.replace(params, constraint=c)
    except SamplingParamError as exc:
        generator.metrics.constraint_refused("invalid")
        raise InvalidRequest([FieldError(exc.field, str(exc).split(": ", 1)[-1])]) from None
    check_compiles(c, generator.tokenizer, (*generator.stop_tokens, *params.stop_token_ids), generator.metrics)
    return params
