"""llama.cpp's CPU GeGLU as ggml computes it (a test oracle for the Gemma families' agreement tests): with
``GGML_GELU_FP16`` (its default) ggml reads GELU from a table of float16 values indexed by the float16 rounding
of the gate: ``y = f16(gelu_tanh(f16(x))) * up``, except ``x <= -10`` gives 0 and ``x >= 10`` gives ``x * up``.
kael computes GELU in float32 (``gelu_tanh_mul``); the table's rounding (about 2^-11 of each value) is the noise
that separates the two on a Gemma file. ``reproduce_ggml_gelu`` swaps the table's numerics into kael's Gemma
models for one test, so the test can show that this rounding is what is left."""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest

__all__ = ["ggml_gelu_tanh_mul", "reproduce_ggml_gelu"]

_F32 = np.float32


def ggml_gelu_tanh_mul(gate: Any, up: Any) -> Any:
    """``gelu_tanh(gate) * up`` with ggml's float16 GELU table (module docstring), as a kael tensor."""
    x = np.asarray(gate.numpy(), _F32)
    u = np.asarray(up.numpy(), _F32)
    h = x.astype(np.float16).astype(_F32)
    inner = _F32(0.7978845608028654) * h * (_F32(1) + _F32(0.044715) * h * h)
    table = (_F32(0.5) * h * (_F32(1) + np.tanh(inner))).astype(np.float16).astype(_F32)
    y = np.where(x <= -10, _F32(0), np.where(x >= 10, x, table)) * u
    return kael.tensor(y.astype(_F32))


def reproduce_ggml_gelu(monkeypatch: pytest.MonkeyPatch) -> None:
    """kael's Gemma 2 / Gemma 3 MLPs compute their GeGLU as ``ggml_gelu_tanh_mul`` until the test ends."""
    import kael.models.gemma3._model as gemma

    monkeypatch.setattr(gemma, "gelu_tanh_mul", ggml_gelu_tanh_mul)
