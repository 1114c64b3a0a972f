"""Fuzz target: kael's sharded-checkpoint reader on arbitrary ``model.safetensors.index.json`` files.

A scratch directory (named with the process id) holds two fixed shards, ``s1.safetensors``
(tensors ``a`` F32 [2] and ``b`` I64 [1]) and ``s2.safetensors`` (``c`` BF16 [3]); every
input becomes its index file and is read by ``read_checkpoint_entries`` and
``load_checkpoint_tensors``. Expected outcomes: success, or ``kael.FormatError``. A finding
is anything else: another exception, an accepted index that breaks a rule (checked here
independently: JSON object without duplicate keys, a non-empty ``weight_map`` of plain
shard names, each named shard's tensors named exactly, nothing else named), a refused
index that keeps every rule, or loaded values that differ from the shards'.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import struct
from typing import Any

import _harness
import numpy as np

with _harness.instrumented(__name__ == "__main__", ["kael"]):
    import kael.ops  # noqa: F401
    from kael import FormatError
    from kael.backends import host
    from kael.io import INDEX_NAME, load_checkpoint_tensors, read_checkpoint_entries

DIR = _harness.scratch_path("checkpoint", ".d")
SHARDS = {"s1.safetensors": {"a", "b"}, "s2.safetensors": {"c"}}
VALUES: dict[str, np.ndarray[Any, Any]] = {
    "a": np.array([1.5, -2.0], np.float32),
    "b": np.array([-7], np.int64),
    "c": np.array([0x3F80, 0xC000, 0x0000], np.uint16),  # bfloat16 bits: 1, -2, 0
}


def _shard(entries: list[tuple[str, str, list[int], bytes]]) -> bytes:
    header: dict[str, Any] = {}
    data = b""
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def _setup() -> None:
    os.makedirs(DIR, exist_ok=True)
    files = {
        "s1.safetensors": _shard([("a", "F32", [2], VALUES["a"].tobytes()), ("b", "I64", [1], VALUES["b"].tobytes())]),
        "s2.safetensors": _shard([("c", "BF16", [3], VALUES["c"].tobytes())]),
    }
    for name, data in files.items():
        with open(os.path.join(DIR, name), "wb") as f:
            f.write(data)


_setup()


@atexit.register
def _remove_scratch_dir() -> None:
    with contextlib.suppress(OSError):
        shutil.rmtree(DIR)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError("duplicate key")
        out[k] = v
    return out


def _plain(name: object) -> bool:
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\0")
        and os.path.basename(name) == name
    )


def _oracle(data: bytes) -> dict[str, str] | None:
    """The weight map the rules accept, or None when the index breaks one."""
    try:
        obj = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    wm, meta = obj.get("weight_map"), obj.get("metadata", {})
    if not isinstance(wm, dict) or not wm or (meta is not None and not isinstance(meta, dict)):
        return None
    if not all(_plain(v) for v in wm.values()):
        return None
    for shard in set(wm.values()):
        if shard not in SHARDS or {n for n, s in wm.items() if s == shard} != SHARDS[shard]:
            return None
    return wm


def TestOneInput(data: bytes) -> None:
    _harness.write_scratch(os.path.join(DIR, INDEX_NAME), data)
    expected = _oracle(data)
    try:
        entries = read_checkpoint_entries(DIR)
    except FormatError:
        entries = None
    if (entries is None) != (expected is None):
        raise AssertionError(f"read_checkpoint_entries gave {entries!r}, the rules say {expected!r}")
    try:
        tensors = load_checkpoint_tensors(DIR)
    except FormatError:
        tensors = None
    if (tensors is None) != (expected is None):
        raise AssertionError(f"load_checkpoint_tensors gave {tensors!r}, the rules say {expected!r}")
    if tensors is None or expected is None or entries is None:
        return
    if set(tensors) != set(expected) or {n: e.file for n, e in entries.items()} != expected:
        raise AssertionError(f"loaded {sorted(tensors)} from {entries!r}, the index names {expected!r}")
    for name, t in tensors.items():
        got = np.asarray(host.view(t), order="C")
        if got.tobytes() != VALUES[name].tobytes():
            raise AssertionError(f"tensor {name!r} holds {got!r}, the shard {VALUES[name]!r}")


if __name__ == "__main__":
    _harness.fuzz(TestOneInput)
