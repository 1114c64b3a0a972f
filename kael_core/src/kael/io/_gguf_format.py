"""The GGUF container's constants: magic, versions, metadata value types, GGML tensor types.

A GGUF file (versions 2 and 3; all integers little-endian) is

    "GGUF"  u32 version  u64 tensor_count  u64 kv_count
    kv_count x   (string key, u32 value type, value)
    tensor_count x (string name, u32 n_dims, n_dims x u64 ne, u32 ggml type, u64 offset)
    padding to the alignment, then the data section (each tensor at its aligned offset)

where a string is a u64 byte length and that many UTF-8 bytes, and an array value is
a u32 element type, a u64 count and the elements. `ne` lists a tensor's dimensions
innermost first: a weight of NumPy shape [N, K] has ne = [K, N].

NOTE [gguf validation]: the reader (`_gguf_read`) checks every rule below before it
allocates anything sized by the file, and refuses with a `FormatError` that names the
file, the field, the value and what was expected:

* magic "GGUF", version 2 or 3 (1 used 32-bit counts and is refused, as are big-endian
  files, whose version reads as a huge number);
* every count and length fits in the bytes that remain (a string of 2**60 bytes or an
  array of 2**40 items is refused before any list is built); arrays nest at most
  `MAX_ARRAY_DEPTH` deep and the arrays inside one array share one element type;
* strings are valid UTF-8; keys and tensor names are unique, non-empty and hold no NUL
  (llama.cpp keeps them as C strings); tensor names are at most `MAX_NAME_BYTES` bytes
  (llama.cpp's GGML_MAX_NAME is 64 with the NUL); bool values are 0 or 1;
* `general.alignment`, when present, is a uint32 power of two (default 32);
* a tensor has at most 4 dims, each ne >= 1 and < 2**63, and a product below 2**63.
  GGUF does not forbid ne = 0, but llama.cpp releases of 2025 divide by ne[1..3] in their
  overflow check (a crash on 0), no model holds an empty tensor, and a zero-size tensor
  could sit anywhere, so kael refuses it (and never writes one);
* a tensor's type is one of `TENSOR_TYPES` (any other GGML type is named in the error);
  ne[0] is a multiple of the block size of block types;
* a tensor's offset (relative to the data section) is a multiple of the alignment, its
  bytes lie inside the file, and no two tensors overlap. Padding after the last tensor
  may be missing (llama.cpp's mapped loader does not read it), and tensors need not be
  in offset order.

Of these, llama.cpp's own parser (ggml's gguf_init_from_file) does not check UTF-8, NUL
characters, empty tensor names, bool bytes or ne = 0, and refuses nested arrays, which
kael reads; tests/core/test_gguf_read.py pins both lists.

The writer (`_gguf_write`) checks the same rules on its inputs, so what it writes the
reader accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_ALIGNMENT",
    "MAGIC",
    "MAX_ARRAY_DEPTH",
    "MAX_DIMS",
    "MAX_NAME_BYTES",
    "OTHER_GGML_TYPES",
    "SCALAR_DTYPES",
    "TENSOR_TYPES",
    "TENSOR_TYPE_NAMES",
    "TENSOR_TYPES_BY_ID",
    "VALUE_TYPES",
    "VALUE_TYPE_IDS",
    "VALUE_TYPE_NAMES",
    "VERSIONS",
    "WRITE_VERSION",
    "TensorType",
    "data_shape",
    "tensor_nbytes",
]

MAGIC = b"GGUF"
VERSIONS = (2, 3)
WRITE_VERSION = 3
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_NAME_BYTES = 63
MAX_ARRAY_DEPTH = 8

# Metadata value types by id, in the order of the specification.
VALUE_TYPES: dict[int, str] = {
    0: "uint8",
    1: "int8",
    2: "uint16",
    3: "int16",
    4: "uint32",
    5: "int32",
    6: "float32",
    7: "bool",
    8: "string",
    9: "array",
    10: "uint64",
    11: "int64",
    12: "float64",
}
VALUE_TYPE_IDS: dict[str, int] = {name: i for i, name in VALUE_TYPES.items()}
VALUE_TYPE_NAMES: tuple[str, ...] = tuple(VALUE_TYPES.values())

# Fixed-size value types and their little-endian NumPy dtypes (bool is one byte, 0 or 1).
SCALAR_DTYPES: dict[str, np.dtype[Any]] = {
    "uint8": np.dtype("u1"),
    "int8": np.dtype("i1"),
    "uint16": np.dtype("<u2"),
    "int16": np.dtype("<i2"),
    "uint32": np.dtype("<u4"),
    "int32": np.dtype("<i4"),
    "float32": np.dtype("<f4"),
    "bool": np.dtype("u1"),
    "uint64": np.dtype("<u8"),
    "int64": np.dtype("<i8"),
    "float64": np.dtype("<f8"),
}


@dataclass(frozen=True)
class TensorType:
    """One GGML tensor type kael reads: its id, block size (elements) and bytes per block.

    `dtype` is the NumPy dtype of the array the reader returns: the element type for
    plain types, uint16 bit patterns for BF16, and bytes (uint8) for block types.
    """

    name: str
    id: int
    block_size: int
    block_bytes: int
    dtype: np.dtype[Any]

    @property
    def is_block(self) -> bool:
        return self.block_size > 1


def _registry_types() -> tuple[TensorType, ...]:
    """The block-quantized types, from the weight-format registry (kael.quant.formats): read as raw uint8 blocks."""
    from ..quant.formats import BLOCK_FORMATS, FORMATS

    return tuple(
        TensorType(n.upper(), FORMATS[n].ggml_type, FORMATS[n].block_values, FORMATS[n].block_bytes, np.dtype("u1"))
        for n in BLOCK_FORMATS
    )


TENSOR_TYPES: dict[str, TensorType] = {
    t.name: t
    for t in (
        TensorType("F32", 0, 1, 4, np.dtype("<f4")),
        TensorType("F16", 1, 1, 2, np.dtype("<f2")),
        TensorType("BF16", 30, 1, 2, np.dtype("<u2")),
        *_registry_types(),
        TensorType("F64", 28, 1, 8, np.dtype("<f8")),
        TensorType("I8", 24, 1, 1, np.dtype("i1")),
        TensorType("I16", 25, 1, 2, np.dtype("<i2")),
        TensorType("I32", 26, 1, 4, np.dtype("<i4")),
        TensorType("I64", 27, 1, 8, np.dtype("<i8")),
    )
}
TENSOR_TYPES_BY_ID: dict[int, TensorType] = {t.id: t for t in TENSOR_TYPES.values()}
TENSOR_TYPE_NAMES: tuple[str, ...] = tuple(TENSOR_TYPES)

# GGML types kael does not read, so that an error names the type instead of a number.
OTHER_GGML_TYPES: dict[int, str] = {
    4: "Q4_2 (removed from GGML)",
    5: "Q4_3 (removed from GGML)",
    9: "Q8_1",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    21: "IQ3_S",
    22: "IQ2_S",
    29: "IQ1_M",
    31: "Q4_0_4_4 (removed from GGML)",
    32: "Q4_0_4_8 (removed from GGML)",
    33: "Q4_0_8_8 (removed from GGML)",
    34: "TQ1_0",
    35: "TQ2_0",
    36: "IQ4_NL_4_4 (removed from GGML)",
    37: "IQ4_NL_4_8 (removed from GGML)",
    38: "IQ4_NL_8_8 (removed from GGML)",
    39: "MXFP4",
    40: "NVFP4",
    41: "Q1_0",
}


def tensor_nbytes(t: TensorType, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of row-major `shape` (Python ints: exact for any shape).

    The caller has checked that shape[-1] is a multiple of the block size.
    """
    n = 1
    for d in shape:
        n *= d
    return n // t.block_size * t.block_bytes


def data_shape(t: TensorType, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of the reader's array: `shape`, except that a block type's last dim counts bytes."""
    if not t.is_block:
        return shape
    return (*shape[:-1], shape[-1] // t.block_size * t.block_bytes)
