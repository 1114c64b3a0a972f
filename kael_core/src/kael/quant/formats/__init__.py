"""The weight-format registry (NOTE [format registry]): every GGML weight type kael knows, declared once.

``FORMATS`` maps each scheme name (GGML's type name in lower case) to its
``WeightFormat``; ``get_format`` and ``by_ggml_type`` look one up and refuse unknown
names or ids, naming the known ones. Declaring a new format: one row in its family's
file and its name in ``_ALL`` below.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from ..._errors import DTypeError, FormatError
from ._float import BF16, F16, F32
from ._iq4 import IQ4_NL, IQ4_XS
from ._kquants import Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
from ._legacy import Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
from ._mixes import MIXES, fitting, mix_base, mix_types, plan_base, use_more_bits
from ._registry import Quantizer, WeightFormat

__all__ = [
    "WeightFormat",
    "FORMATS",
    "BLOCK_FORMATS",
    "REFERENCE_QUANTIZERS",
    "MIXES",
    "get_format",
    "by_ggml_type",
    "mix_base",
    "mix_types",
    "fitting",
    "plan_base",
    "use_more_bits",
]

_ALL = (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)

FORMATS = MappingProxyType({f.name: f for f in _ALL})
"""Every weight format by scheme name, in declaration order."""

BLOCK_FORMATS = tuple(f.name for f in _ALL if f.blocked)
"""The names of the block-quantized formats."""

REFERENCE_QUANTIZERS: MappingProxyType[str, Quantizer] = MappingProxyType(
    {f.name: f.quantize_blocks for f in _ALL if f.quantize_blocks is not None}
)
"""ggml's reference quantizer (no importance matrix) of every block format, by name: finite float32
blocks [nb, block_values] -> the bytes ``llama-quantize`` (and ``gguf.quants.quantize`` where it has
one) writes [nb, block_bytes] (NOTE [bit-exact K-quant search] for the K-quants and IQ4)."""

_BY_TYPE = {f.ggml_type: f for f in _ALL}


def get_format(name: Any) -> WeightFormat:
    """The format called `name`; a DTypeError naming the known ones otherwise."""
    fmt = FORMATS.get(name) if isinstance(name, str) else None
    if fmt is None:
        raise DTypeError(f"unknown weight format {name!r}; expected one of {', '.join(FORMATS)}")
    return fmt


def by_ggml_type(type_id: int) -> WeightFormat:
    """The format of GGML type id `type_id`; a FormatError naming the supported types otherwise."""
    fmt = _BY_TYPE.get(type_id)
    if fmt is None:
        known = ", ".join(f"{f.ggml_type} ({f.name})" for f in _ALL)
        raise FormatError(f"GGML type {type_id} is not a weight format kael reads; supported: {known}")
    return fmt
