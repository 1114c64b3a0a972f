"""Deprecated location of the host I/O helpers: use ``kael.backends.host`` (kept for old imports)."""

from __future__ import annotations

from ..host._io import bf16_bits_to_f32, compute_np, f32_to_bf16_bits, rd, view, wr

__all__ = ["rd", "wr", "view", "f32_to_bf16_bits", "bf16_bits_to_f32", "compute_np"]
