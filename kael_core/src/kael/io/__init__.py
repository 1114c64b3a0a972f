"""File formats: safetensors (load, in copy or memory-mapped mode, and atomic save).

Format rules and validation live in `_safetensors_format` (bytes and NumPy only),
file access in `_safetensors_load` / `_safetensors_save`, atomic writes in `_atomic`.
"""

from __future__ import annotations

from ._safetensors_load import load_safetensors, load_safetensors_with_metadata
from ._safetensors_save import save_safetensors

__all__ = ["load_safetensors", "load_safetensors_with_metadata", "save_safetensors"]
