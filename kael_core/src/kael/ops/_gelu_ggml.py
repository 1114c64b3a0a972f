"""GELU's tanh approximation as llama.cpp's CPU backend computes it, selectable with ``KAEL_GELU=ggml``.

NOTE [ggml GELU table]: ggml's CPU backend is built with ``GGML_GELU_FP16``: its float32 ``gelu`` and
``geglu`` read GELU from a table of 65536 float16 values, ``table[h] = f16(gelu_tanh(f32(h)))``, indexed by
the float16 rounding ``h`` of the input, except that ``x <= -10`` gives 0 and ``x >= 10`` gives ``x``
(``ggml_vec_gelu_f32`` / ``ggml_vec_geglu_f32`` in ggml-cpu's ``vec.h``; the table is filled in
``ggml_cpu_init``). So llama.cpp's GELU carries two float16 roundings (about 2^-11 relative each), where kael
and PyTorch compute it in float32. On a GGUF file of a random-weight Gemma model, whose logits are nearly
flat, that rounding alone flips a few percent of llama.cpp's top tokens against kael's (issue 31).

``KAEL_GELU`` is read at every call of ``gelu(approximate="tanh")`` and ``gelu_tanh_mul`` (and GPT-2's
decode step): unset or ``exact`` computes in float32 (the default and the reference the conformance kit
checks), ``ggml`` computes float32 inputs as above, so that kael gives llama.cpp's values on its files; with
``KAEL_QUANT_ACTIVATIONS=q8`` (ggml's rounding of activations before quantized dot products) it is kael's
"llama.cpp arithmetic". Float16 and bfloat16 inputs and the exact-erf GELU are unaffected (a float16 gate
already rounds as the table does). Gradients stay those of the smooth function: the table is a forward
numerics choice, as in ggml, which has no GELU backward through its table.

The table is not stored: its entry is computed per element from the rounded input in the float32 operation
order of ggml's ``ggml_gelu_f32`` (with the one fused multiply-add its build makes) and kael's ``tanh``.
That gives ggml's table entry for every one of the 63488 finite float16 inputs (checked against the table
itself, read from llama-cpp-python's libggml-cpu, in the tests), though the float32 value before the table's
rounding differs from ggml's in the last bit for about 2% of them.
"""

from __future__ import annotations

import os

from .. import _dtype as dt
from .._errors import KaelError
from .._tensor import Tensor
from ._core import cast

__all__ = ["GELU_ENV", "ggml_gelu", "ggml_gelu_tanh", "ggml_gelu_tanh_mul"]

#: The environment variable that selects GELU's numerics (NOTE [ggml GELU table]).
GELU_ENV = "KAEL_GELU"

_MODES = ("exact", "ggml")

# ggml-cpu's vec.h constants, as float32 (kael's binary ops take Python floats as the tensor's dtype).
_COEF_A = 0.044715
_SQRT_2_OVER_PI = 0.79788456080286535587989211986876


def ggml_gelu(x: Tensor) -> bool:
    """True where ``KAEL_GELU=ggml`` applies to a tanh GELU of ``x`` (a float32 tensor); a KaelError for a
    ``KAEL_GELU`` that is neither ``exact`` nor ``ggml``."""
    mode = os.environ.get(GELU_ENV) or "exact"
    if mode not in _MODES:
        raise KaelError(f"gelu: {GELU_ENV} must be 'exact' or 'ggml' (or unset: exact), got {mode!r}")
    return mode == "ggml" and x.dtype is dt.float32


def _ggml_gelu_f32(h: Tensor) -> Tensor:
    """``0.5f*h*(1.0f + tanhf(SQRT_2_OVER_PI*h*(1.0f + GELU_COEF_A*h*h)))`` in the float32 order of ggml's
    ``ggml_gelu_f32`` as its build computes it when it fills the table."""
    from ._pointwise import binary, unary

    # 1.0f + GELU_COEF_A*h*h is one fused multiply-add in ggml's build (its table says so at one input of
    # the 63488): (A*h) rounded to float32, times h plus 1 rounded once (the float32 product is exact in
    # float64).
    a = cast(binary("mul", h, _COEF_A), dt.float64)
    poly = cast(binary("add", binary("mul", a, cast(h, dt.float64)), 1.0), dt.float32)
    inner = binary("mul", binary("mul", h, _SQRT_2_OVER_PI), poly)
    return binary("mul", binary("mul", h, 0.5), binary("add", unary("tanh", inner), 1.0))


def ggml_gelu_tanh(x: Tensor) -> Tensor:
    """gelu_tanh(x) of a float32 ``x`` with ggml's float16 table (NOTE [ggml GELU table]), without autograd."""
    from ._pointwise import Where, binary

    h = cast(cast(x, dt.float16), dt.float32)
    table = cast(cast(_ggml_gelu_f32(h), dt.float16), dt.float32)
    high = Where.apply(binary("ge", x, 10.0), x, table)
    return Where.apply(binary("le", x, -10.0), 0.0, high)  # type: ignore[no-any-return]


def ggml_gelu_tanh_mul(gate: Tensor, up: Tensor) -> Tensor:
    """gelu_tanh(gate) * up as ggml's ``geglu`` computes it for float32 (the table, then the product)."""
    from ._pointwise import binary

    return binary("mul", ggml_gelu_tanh(gate), up)
