"""File formats: safetensors (load, in copy or memory-mapped mode, and atomic save),
checkpoint directories (one ``model.safetensors`` or Hugging Face's sharded layout) and
GGUF containers (a strict memory-mapped reader and an atomic writer).

Format rules and validation live in `_safetensors_format` (bytes and NumPy only),
file access in `_safetensors_load` / `_safetensors_save`, atomic writes in `_atomic`,
checkpoint directories (index, shards, expectations) in `_checkpoint`; GGUF's constants
in `_gguf_format`, its reader in `_gguf_read`, its writer in `_gguf_write`.
"""

from __future__ import annotations

from ._checkpoint import (
    INDEX_NAME,
    SINGLE_NAME,
    CheckpointEntry,
    load_checkpoint_tensors,
    read_checkpoint_entries,
    save_checkpoint_tensors,
)
from ._gguf_format import TENSOR_TYPE_NAMES as GGUF_TENSOR_TYPES
from ._gguf_format import VALUE_TYPE_NAMES as GGUF_VALUE_TYPES
from ._gguf_read import GGUFFile, GGUFTensor, read_gguf
from ._gguf_write import GGUFValue, write_gguf
from ._safetensors_load import load_safetensors, load_safetensors_with_metadata
from ._safetensors_save import save_safetensors

__all__ = [
    "GGUF_TENSOR_TYPES",
    "GGUF_VALUE_TYPES",
    "INDEX_NAME",
    "SINGLE_NAME",
    "CheckpointEntry",
    "GGUFFile",
    "GGUFTensor",
    "GGUFValue",
    "load_checkpoint_tensors",
    "load_safetensors",
    "load_safetensors_with_metadata",
    "read_checkpoint_entries",
    "read_gguf",
    "save_checkpoint_tensors",
    "save_safetensors",
    "write_gguf",
]
