"""ggml's own Q8_K code through ctypes, as a test oracle: ``quantize_row_q8_K_ref`` (libggml-base)
and the reference C dot products ``ggml_vec_dot_<format>_q8_K_generic`` (libggml-cpu), from the
libraries llama-cpp-python ships. ``quantize(x)`` and ``dot(scheme, weight_row, x_row)`` skip the
calling test when llama_cpp (or a symbol) is absent.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import llama_cpp_tools
import numpy as np
import pytest

__all__ = ["BLOCK_Q8_K", "dot", "quantize"]

#: block_q8_K (ggml-common.h): float d, int8 qs[256], int16 bsums[16]
BLOCK_Q8_K = np.dtype([("d", "<f4"), ("qs", "i1", (256,)), ("bsums", "<i2", (16,))])
assert BLOCK_Q8_K.itemsize == 292

_LIBS: dict[str, Any] = {}


def _lib(name: str) -> Any:
    if name not in _LIBS:
        llama_cpp = pytest.importorskip(
            "llama_cpp", reason=llama_cpp_tools.SKIP_REASON + ": no llama_cpp package (llama-cpp-python)"
        )
        path = os.path.join(os.path.dirname(llama_cpp.__file__), "lib", name)
        if not os.path.exists(path):
            pytest.skip(f"{llama_cpp_tools.SKIP_REASON}: llama_cpp has no {path}")
        lib = ctypes.CDLL(path)
        if hasattr(lib, "ggml_cpu_init"):  # its float16 table, which the dot products read
            lib.ggml_cpu_init.restype, lib.ggml_cpu_init.argtypes = None, []
            lib.ggml_cpu_init()
        _LIBS[name] = lib
    return _LIBS[name]


def _fn(lib: str, name: str) -> Any:
    fn = getattr(_lib(lib), name, None)
    if fn is None:
        pytest.skip(f"{lib} does not export {name}")
    return fn


def quantize(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_K_ref of one float32 row (k % 256 == 0): block_q8_K records [k / 256]."""
    fn = _fn("libggml-base.so", "quantize_row_q8_K_ref")
    fn.restype, fn.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    src = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(src.size // 256, BLOCK_Q8_K)
    fn(src.ctypes.data, out.ctypes.data, src.size)
    return out


def dot(scheme: str, weight_row: np.ndarray, x_blocks: np.ndarray) -> float:
    """ggml_vec_dot_<scheme>_q8_K_generic of one weight row (uint8 super-blocks) and one Q8_K row."""
    name = {"iq4_xs": "iq4_xs"}.get(scheme, scheme.replace("_k", "_K"))
    fn = _fn("libggml-cpu.so", f"ggml_vec_dot_{name}_q8_K_generic")
    p, sz = ctypes.c_void_p, ctypes.c_size_t
    fn.restype, fn.argtypes = None, [ctypes.c_int, p, sz, p, sz, p, sz, ctypes.c_int]
    w = np.ascontiguousarray(weight_row, dtype=np.uint8)
    y = np.ascontiguousarray(x_blocks)
    s = np.zeros(1, np.float32)
    fn(256 * y.size, s.ctypes.data, 0, w.ctypes.data, 0, y.ctypes.data, 0, 1)
    return float(s[0])
