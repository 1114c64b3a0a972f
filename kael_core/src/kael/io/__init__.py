"""File formats: safetensors (load, in copy or memory-mapped mode, and atomic save) and
checkpoint directories (one ``model.safetensors`` or Hugging Face's sharded layout).

Format rules and validation live in `_safetensors_format` (bytes and NumPy only),
file access in `_safetensors_load` / `_safetensors_save`, atomic writes in `_atomic`,
checkpoint directories (index, shards, expectations) in `_checkpoint`.
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
from ._safetensors_load import load_safetensors, load_safetensors_with_metadata
from ._safetensors_save import save_safetensors

__all__ = [
    "INDEX_NAME",
    "SINGLE_NAME",
    "CheckpointEntry",
    "load_checkpoint_tensors",
    "load_safetensors",
    "load_safetensors_with_metadata",
    "read_checkpoint_entries",
    "save_checkpoint_tensors",
    "save_safetensors",
]
