"""What the tests/core/test_safetensors*.py files share: the dtypes the NumPy layer takes (``NP_OF``, and
``REF_DTYPES``, those the reference package's NumPy API has), the shapes the round trips use, seeded sample
arrays, safetensors file images built byte by byte (``file_image``) and written out (``write_file``), a small
file with an aligned and a misaligned tensor (``packed_file``), bit-for-bit array comparison, whether an array
is a view of a file mapping, and the names of the files in a directory.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "NP_OF",
    "REF_DTYPES",
    "SHAPES",
    "file_image",
    "file_names",
    "is_mapped",
    "packed_file",
    "same_bits",
    "sample_array",
    "write_file",
]

# kael dtype name -> NumPy dtype of the arrays the NumPy layer takes and returns
NP_OF = {
    "float64": np.float64,
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": np.uint16,
    "int64": np.int64,
    "int32": np.int32,
    "int16": np.int16,
    "int8": np.int8,
    "uint8": np.uint8,
    "bool": np.bool_,
}
SHAPES = [(), (0,), (5,), (2, 3), (2, 0, 4), (1, 1, 1, 3)]
REF_DTYPES = [d for d in NP_OF if d != "bfloat16"]  # safetensors.numpy has no bfloat16


def sample_array(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray[Any, Any]:
    """A random array of the kael dtype ``dtype`` (as the NumPy layer holds it) and ``shape``, seeded with ``seed``."""
    rng = np.random.default_rng(seed)
    npd: np.dtype[Any] = np.dtype(NP_OF[dtype])
    if npd == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if npd.kind == "f":
        return rng.standard_normal(shape).astype(npd)
    info = np.iinfo(npd)
    return rng.integers(info.min, info.max, shape, dtype=npd, endpoint=True)


def file_image(header: Any, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A file image: 8-byte length, header (a JSON-able object, str or bytes), data."""
    if isinstance(header, bytes):
        raw = header
    else:
        raw = (header if isinstance(header, str) else json.dumps(header)).encode("utf-8")
    n = len(raw) if length is None else length
    return struct.pack("<Q", n) + raw + data


def write_file(tmp_path: Path, raw: bytes, name: str = "f.safetensors") -> Path:
    """``raw`` written to ``tmp_path / name``."""
    p = tmp_path / name
    p.write_bytes(raw)
    return p


def same_bits(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    """Same dtype, shape and bits (NaNs included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def is_mapped(arr: np.ndarray[Any, Any]) -> bool:
    """Whether ``arr`` is (a view of) a memory-mapped file."""
    base: Any = arr
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = getattr(base, "base", None) if hasattr(base, "base") else getattr(base, "obj", None)
    return False


def packed_file(tmp_path: Path) -> Path:
    """A valid file of three tensors written in ``tmp_path``, the last misaligned for its item size."""
    # F32 [2] at 0, BOOL [1] at 8, I64 [1, 1] at 9: the last is misaligned for 8-byte items.
    header = {
        "__metadata__": {"seed": "fuzz"},
        "f": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "BOOL", "shape": [1], "data_offsets": [8, 9]},
        "i": {"dtype": "I64", "shape": [1, 1], "data_offsets": [9, 17]},
    }
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    data = np.array([1.5, -2.0], "<f4").tobytes() + b"\x01" + np.array([123456789], "<i8").tobytes()
    return write_file(tmp_path, file_image(h, data))


def file_names(tmp_path: Path) -> list[str]:
    """The names of the files in ``tmp_path``, sorted."""
    return sorted(p.name for p in tmp_path.iterdir())
