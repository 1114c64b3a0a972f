"""Fuzz target: kael's GGUF reader (and writer) on arbitrary file contents.

Every input is written to a temporary file named with the process id and read with
`kael.io.read_gguf`; each tensor has its first and last byte read from the mapping, so
a view past the end of the file faults here rather than in a user's program. A file
kael accepts is then

* read by the `gguf` package's `GGUFReader` (llama.cpp's Python reader, when installed),
  which must find the same metadata (types and values) and the same tensors (names,
  types, shapes, offsets and bytes);
* written back with `kael.io.write_gguf` (every value with its type pinned) and read
  again, which must give the same file contents.

Expected outcomes: success, or `kael.FormatError`. A finding is anything else: another
exception, a disagreement, a crash, a hang or an allocation over the runner's limit.

The `gguf` reader is more lenient than kael (NOTE [gguf validation] lists kael's rules),
so only files kael accepts are compared. Where it cannot read a file that the GGUF
specification allows, the comparison is skipped, not flagged:

* a metadata key named `GGUF.version`, `GGUF.tensor_count` or `GGUF.kv_count`: the
  reader stores the header under those names and raises KeyError("Duplicate ...");
* a BF16 tensor with no dims (n_dims 0: one element, as in ggml): the reader views BF16
  as bytes and indexes the last dim of the shape, an IndexError;
* nested arrays: it flattens them, and takes the leaf type from the first inner array,
  so an empty first inner array hides it: they are compared as flattened leaves, only
  when the leaf type it reports is the one kael reads.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import struct
from typing import Any

import _harness
import numpy as np

with _harness.instrumented(__name__ == "__main__", ["kael"]):
    from kael import FormatError
    from kael.io import GGUFFile, GGUFValue, read_gguf, write_gguf

try:  # the reference reader, as an independent oracle when installed
    import gguf as _reference
except ImportError:  # pragma: no cover
    _reference = None  # type: ignore[assignment]

PATH = _harness.scratch_path("gguf", ".gguf")
COPY = _harness.scratch_path("gguf", ".copy.gguf")
_PSEUDO_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")


@atexit.register
def _remove_scratch_files() -> None:
    for p in (PATH, COPY):
        with contextlib.suppress(OSError):
            os.remove(p)


# (metadata {key: (type name, value)}, tensors [(name, type, shape, offset, bytes)], alignment)
Read = tuple[dict[str, tuple[str, Any]], list[tuple[str, str, tuple[int, ...], int, bytes]], int]


#: The NumPy dtype read_gguf gives each GGML type's data (what write_gguf takes back), as seen.
_DTYPES: dict[str, np.dtype[Any]] = {}


def _snapshot(f: GGUFFile) -> Read:
    tensors = []
    for t in f.tensors.values():
        _DTYPES[t.type] = t.data.dtype
        raw = t.data.reshape(-1).view(np.uint8)
        if raw.size != t.nbytes:
            raise AssertionError(f"tensor {t.name!r}: {raw.size} bytes mapped, {t.nbytes} expected")
        _ = int(raw[0]) + int(raw[-1])  # touch both ends of the mapping
        tensors.append((t.name, t.type, t.shape, t.offset, raw.tobytes()))
    return {k: (f.metadata_types[k], v) for k, v in f.metadata.items()}, tensors, f.alignment


def _read(path: str) -> Read | None:
    try:
        f = read_gguf(path)
    except FormatError:
        return None
    with f:
        if set(f.metadata) != set(f.metadata_types):
            raise AssertionError("metadata and metadata_types name different keys")
        return _snapshot(f)


def _same(a: Any, b: Any) -> bool:
    """Equal values, NaN equal to NaN and -0.0 told from 0.0; bool is not int."""
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


def _flatten(v: Any) -> list[Any]:
    return [y for x in v for y in _flatten(x)] if isinstance(v, list) else [v]


def _leaf_type(type_name: str) -> str:
    while type_name.startswith("array["):
        type_name = type_name[6:-1]
    return type_name


def _check_metadata(reader: Any, metadata: dict[str, tuple[str, Any]]) -> None:
    fields = {k: f for k, f in reader.fields.items() if k not in _PSEUDO_FIELDS}
    if list(fields) != list(metadata):
        raise AssertionError(f"metadata keys differ: gguf {list(fields)!r}, kael {list(metadata)!r}")
    for key, (tname, value) in metadata.items():
        field = fields[key]
        names = [t.name.lower() for t in field.types]
        if not tname.startswith("array["):
            if names != [tname] or not _same(field.contents(), value):
                raise AssertionError(f"{key!r}: gguf {names} {field.contents()!r}, kael {tname} {value!r}")
            continue
        if names[0] != "array":
            raise AssertionError(f"{key!r}: gguf types {names}, kael {tname}")
        if tname.startswith("array[array"):  # nested: the reader flattens (see the docstring)
            if names[-1] == _leaf_type(tname) and not _same(field.contents(), _flatten(value)):
                raise AssertionError(f"{key!r}: gguf leaves {field.contents()!r}, kael {value!r}")
            continue
        if value and names != ["array", tname[6:-1]]:
            raise AssertionError(f"{key!r}: gguf types {names}, kael {tname}")
        if not _same(field.contents(), value):
            raise AssertionError(f"{key!r}: gguf {field.contents()!r}, kael {value!r}")


def _check_reference(read: Read) -> None:
    """What kael accepts, the gguf package reads the same (or cannot read, as documented)."""
    if _reference is None:
        return
    metadata, tensors, _ = read
    if any(k in metadata for k in _PSEUDO_FIELDS) or any(t == "BF16" and not s for _, t, s, _, _ in tensors):
        return
    try:
        reader = _reference.GGUFReader(PATH)
    except Exception as e:  # any refusal of a file kael accepts is a disagreement
        raise AssertionError(f"kael read a file the gguf package refuses: {e!r}") from None
    _check_metadata(reader, metadata)
    theirs = [
        (t.name, t.tensor_type.name, tuple(reversed([int(d) for d in t.shape])), int(t.data_offset), t.data.tobytes())
        for t in reader.tensors
    ]
    if theirs != tensors:
        raise AssertionError(f"tensors differ: gguf {theirs!r:.2000}, kael {tensors!r:.2000}")


def _check_rewrite(read: Read) -> None:
    """write_gguf of what was read, read again, gives the same contents."""
    metadata, tensors, alignment = read
    typed = {k: GGUFValue(t, v) for k, (t, v) in metadata.items()}
    arrays = [(n, t, s, np.frombuffer(raw, _DTYPES[t])) for n, t, s, _, raw in tensors]
    try:
        write_gguf(COPY, typed, arrays, alignment=alignment)
    except FormatError as e:
        raise AssertionError(f"write_gguf refused what read_gguf accepted: {e}") from None
    again = _read(COPY)
    if again is None:
        raise AssertionError("read_gguf refused what write_gguf wrote")
    m2, t2, _ = again
    if list(m2) != list(metadata) or any(m2[k][0] != metadata[k][0] or not _same(m2[k][1], metadata[k][1]) for k in m2):
        raise AssertionError(f"metadata changed in a rewrite: {m2!r:.2000} != {metadata!r:.2000}")
    if [(n, t, s, b) for n, t, s, _, b in t2] != [(n, t, s, b) for n, t, s, _, b in tensors]:
        raise AssertionError("tensors changed in a rewrite")


def TestOneInput(data: bytes) -> None:
    _harness.write_scratch(PATH, data)
    read = _read(PATH)
    if read is not None:
        _check_reference(read)
        _check_rewrite(read)
    for p in (PATH, COPY):
        with contextlib.suppress(OSError):
            os.remove(p)


if __name__ == "__main__":
    _harness.fuzz(TestOneInput)
