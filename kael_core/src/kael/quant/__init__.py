"""``kael.quant``: weight formats (GGML block formats, bfloat16, float16) and quantized layers.

NOTE [weight formats] (``_formats.py``) describes the byte layouts and the rounding.

Names
-----
* ``SCHEMES``: every format of the registry ``kael.quant.formats`` but f32 (f16, bf16, q8_0,
  q4_0, q4_1, q5_0, q5_1, q2_k..q6_k, iq4_nl, iq4_xs); ``BLOCK_BYTES`` and ``BLOCK_VALUES``
  (bytes and values per block of each block format), ``BLOCK_SIZE`` (32, the legacy formats'
  block); ``quantizable()``: the schemes kael can write (a reference quantizer).
* ``quantize_array(a, scheme)``: a float [N, K] NumPy array in a scheme (the bytes
  ``gguf.quants.quantize`` gives for Q8_0 / Q4_0; bfloat16 as uint16 bit patterns);
  ``dequantize_array(data, scheme, k)``: back to float32 [N, K]; ``storage_shape(scheme, n, k)``.
* ``to_device_weight(data, scheme, device)``: the Tensor the ops take (uint8 / bfloat16 / float16).
* ``QuantizedLinear(in_features, out_features, scheme, bias=True, device=None)`` and
  ``QuantizedLinear.from_float(weight, bias, scheme)``.
* ``quantize(model, scheme, *, embeddings=False, skip=())`` (also ``kael.quantize``): every
  projection of a model swapped for a QuantizedLinear, in place; ``projection_of(module)``.
* The ops themselves are ``kael.ops.dequantize(weight, scheme)`` and
  ``kael.ops.quantized_linear(x, weight, bias, scheme)``.
"""

from __future__ import annotations

from ._formats import (
    BLOCK_BYTES,
    BLOCK_SIZE,
    BLOCK_VALUES,
    SCHEMES,
    dequantize_array,
    quantizable,
    quantize_array,
    storage_shape,
    to_device_weight,
)
from ._linear import QuantizedLinear
from ._quantize import projection_of, quantize

__all__ = [
    "SCHEMES",
    "BLOCK_SIZE",
    "BLOCK_BYTES",
    "BLOCK_VALUES",
    "quantizable",
    "quantize_array",
    "dequantize_array",
    "storage_shape",
    "to_device_weight",
    "QuantizedLinear",
    "quantize",
    "projection_of",
]
