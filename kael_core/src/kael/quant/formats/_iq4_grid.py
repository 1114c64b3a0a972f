"""The 16 values of GGML's non-linear 4-bit grid (``kvalues_iq4nl``), shared by the IQ4 dequantizers and quantizers."""

from __future__ import annotations

import numpy as np

__all__ = ["KVALUES"]

KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
"""ggml's ``kvalues_iq4nl``: the value each 4-bit index of an IQ4_NL or IQ4_XS block selects (times the scale)."""
