"""Reading a capped request body and decoding it into a schema Struct with client-safe errors.

All problems are collected (not just the first) and reported by field name with the rule that
was broken; the offending values and unknown keys are never repeated back to the client. A
schema that does not forbid unknown fields (the OpenAI requests, as vLLM and llama.cpp do)
ignores them and names them in one log warning instead, except the fields it declares
``unsupported_fields`` (each a 400 naming it: it would change the output) and ``inert_fields``
(accepted silently; ``kael_server.field_policy``).
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Iterator
from typing import Any, TypeVar, cast

import msgspec
from kael.engine import SamplingParamError, SamplingParams
from litestar import Request

from kael_server import field_policy
from kael_server.errors import BodyTooLarge, ClientGone, FieldError, InvalidRequest
from kael_server.logs import get_logger

__all__ = ["decode", "read_body", "sampling_params_of"]

T = TypeVar("T", bound=msgspec.Struct)
_LOGGED_NAMES = 16
_LOGGED_NAME_CHARS = 64


def sampling_params_of(**fields: Any) -> SamplingParams:
    """kael's SamplingParams from a decoded body's fields; a value the engine refuses is an
    InvalidRequest naming that field (the rule it broke, never the value)."""
    try:
        return SamplingParams(**fields)
    except SamplingParamError as exc:
        rule = str(exc).split(" must be ", 1)[-1].rsplit(", got ", 1)[0]
        raise InvalidRequest([FieldError(exc.field, f"expected {rule}")]) from None


async def read_body(request: Request[Any, Any, Any], limit: int) -> bytes:
    """The request body, refused with BodyTooLarge as soon as it passes ``limit`` bytes.

    A declared Content-Length over the limit is refused before reading anything; otherwise
    the body is counted chunk by chunk as it arrives, so a huge upload is never buffered.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = cast(bytes, message.get("body", b""))
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def decode(body: bytes, schema: type[T]) -> T:
    """``body`` parsed as JSON and checked against ``schema``; raises InvalidRequest listing every problem."""
    try:
        data = msgspec.json.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        # msgspec also refuses lone surrogates ("\ud800") here.
        raise InvalidRequest([FieldError("body", "malformed JSON or invalid Unicode")]) from None
    if not isinstance(data, dict):
        raise InvalidRequest([FieldError("body", "expected a JSON object")])

    fields = _fields(schema)
    errors: list[FieldError] = []
    if unknown := set(data) - set(fields):
        if schema.__struct_config__.forbid_unknown_fields:
            errors.append(FieldError("body", f"{len(unknown)} unknown field(s); allowed: {', '.join(fields)}"))
    refused: dict[str, str] = getattr(schema, "unsupported_fields", {})
    for name in sorted(unknown & set(refused)):
        if (why := field_policy.refused(name, data[name])) is not None:
            errors.append(FieldError(name, f"not supported: {why}"))
    inert: frozenset[str] = getattr(schema, "inert_fields", frozenset())
    unknown_names = sorted(n for n in unknown if n not in refused and n not in inert)
    values: dict[str, Any] = {}
    for name, spec in fields.items():
        if name not in data:
            if spec.required:
                errors.append(FieldError(name, "field required"))
            continue
        if spec.empty is not None and _is_empty(data[name]):
            errors.append(FieldError(name, spec.empty))
            continue
        if spec.nested is not None and isinstance(data[name], dict):
            unknown_names += sorted(f"{name}.{key}" for key in set(data[name]) - set(_fields(spec.nested)))
        try:
            value = msgspec.convert(data[name], spec.hint, strict=True)
        except msgspec.ValidationError:
            errors.append(FieldError(name, f"expected {spec.expect}"))
            continue
        if spec.check is not None and value is not None and not spec.check(value):
            errors.append(FieldError(name, f"expected {spec.expect}"))
        elif not all(_is_unicode(s) for s in _strings(value)):
            errors.append(FieldError(name, "invalid Unicode (lone surrogate)"))
        else:
            values[name] = value
    if errors:
        raise InvalidRequest(errors)
    if unknown_names and not schema.__struct_config__.forbid_unknown_fields:
        _warn_unknown(schema, unknown_names)
    return schema(**values)


def _warn_unknown(schema: type[msgspec.Struct], names: list[str]) -> None:
    """One warning naming the ignored fields (shortened and capped: a body may hold thousands)."""
    shown = [n if len(n) <= _LOGGED_NAME_CHARS else n[:_LOGGED_NAME_CHARS] + "..." for n in names[:_LOGGED_NAMES]]
    get_logger().warning("unknown_fields_ignored", schema=schema.__name__, fields=shown, count=len(names))


def _is_empty(value: Any) -> bool:
    """ "" or [], or a list holding one (a prompt list with an empty prompt)."""
    if value == "" or value == []:
        return True
    return isinstance(value, list) and any(item == "" or item == [] for item in value)


class _FieldSpec(typing.NamedTuple):
    hint: Any
    required: bool
    expect: str
    check: typing.Callable[[Any], bool] | None
    empty: str | None
    """The message for an empty value, when the field says what that is."""
    nested: type[msgspec.Struct] | None
    """The Struct the field holds (its unknown keys are named too)."""


@functools.cache
def _fields(schema: type[msgspec.Struct]) -> dict[str, _FieldSpec]:
    hints = typing.get_type_hints(schema, include_extras=True)
    info = msgspec.structs.fields(schema)
    specs = {}
    for field in info:
        extra = _extra(hints[field.name])
        specs[field.name] = _FieldSpec(
            hint=hints[field.name],
            required=field.required,
            expect=extra.get("expect", "a value of the documented type"),
            check=extra.get("check"),
            empty=extra.get("empty"),
            nested=_struct_in(hints[field.name]),
        )
    return specs


def _struct_in(hint: Any) -> type[msgspec.Struct] | None:
    """The Struct type that ``hint`` is (through Annotated and Optional), if any."""
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return hint
    for arg in typing.get_args(hint):
        if (found := _struct_in(arg)) is not None:
            return found
    return None


def _extra(hint: Any) -> dict[str, Any]:
    """The ``Meta.extra`` of the outermost annotated layer of ``hint`` that has one."""
    for meta in getattr(hint, "__metadata__", ()):
        if isinstance(meta, msgspec.Meta) and meta.extra:
            return dict(meta.extra)
    for arg in typing.get_args(hint):
        if found := _extra(arg):
            return found
    return {}


def _strings(value: Any) -> Iterator[str]:
    """Every string in ``value`` (lists and objects walked without recursion: a body may nest deep)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):  # a JSON schema, a tool: keys and values
            stack.extend(item.keys())
            stack.extend(item.values())


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
