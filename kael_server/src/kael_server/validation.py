"""Reading a capped request body and decoding it into a schema Struct with client-safe errors.

All problems are collected (not just the first) and reported by field name with the rule that
was broken; the offending values and unknown keys are never repeated back to the client.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Iterator
from typing import Any, TypeVar, cast

import msgspec
from litestar import Request

from kael_server.errors import BodyTooLarge, ClientGone, FieldError, InvalidRequest

T = TypeVar("T", bound=msgspec.Struct)


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
        errors.append(FieldError("body", f"{len(unknown)} unknown field(s); allowed: {', '.join(fields)}"))
    values: dict[str, Any] = {}
    for name, spec in fields.items():
        if name not in data:
            if spec.required:
                errors.append(FieldError(name, "field required"))
            continue
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
    return schema(**values)


class _FieldSpec(typing.NamedTuple):
    hint: Any
    required: bool
    expect: str
    check: typing.Callable[[Any], bool] | None


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
        )
    return specs


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
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
