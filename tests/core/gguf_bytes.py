"""A GGUF byte builder for the tests, written from the specification with `struct` only.

Independent of kael's writer, so the reader's tests can make files that break exactly
one rule: `build(kvs=[...], infos=[...], data=b"...")` where each kv is
`kv(key, type_id, payload)` and each tensor info is `info(name, ne, type_id, offset)`.
"""

from __future__ import annotations

import struct

__all__ = ["array", "build", "info", "kv", "s", "u32", "u64"]

TYPE = {
    "uint8": 0,
    "int8": 1,
    "uint16": 2,
    "int16": 3,
    "uint32": 4,
    "int32": 5,
    "float32": 6,
    "bool": 7,
    "string": 8,
    "array": 9,
    "uint64": 10,
    "int64": 11,
    "float64": 12,
}


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def s(text: str | bytes) -> bytes:
    """A GGUF string: u64 length, then the bytes."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return u64(len(raw)) + raw


def kv(key: str | bytes, type_id: int, payload: bytes) -> bytes:
    return s(key) + u32(type_id) + payload


def array(elem_type: int, count: int, items: bytes) -> bytes:
    return u32(elem_type) + u64(count) + items


def info(name: str | bytes, ne: list[int], type_id: int, offset: int) -> bytes:
    return s(name) + u32(len(ne)) + b"".join(u64(d) for d in ne) + u32(type_id) + u64(offset)


def build(
    kvs: list[bytes] = [],  # noqa: B006 (never mutated)
    infos: list[bytes] = [],  # noqa: B006
    data: bytes = b"",
    *,
    version: int = 3,
    alignment: int = 32,
    n_kv: int | None = None,
    n_tensors: int | None = None,
    magic: bytes = b"GGUF",
) -> bytes:
    """Header, kvs, infos, zero padding to `alignment`, then `data` (offsets relative to it)."""
    head = magic + u32(version) + u64(len(infos) if n_tensors is None else n_tensors)
    head += u64(len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(infos)
    return head + b"\0" * (-len(head) % alignment) + data
