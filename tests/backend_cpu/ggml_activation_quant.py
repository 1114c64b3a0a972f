"""ggml's own activation quantizers and Q8_K dot products through ctypes, as test oracles, from the
libraries llama-cpp-python ships: ``quantize_row_q8_K_ref`` (libggml-base), the reference C dot products
``ggml_vec_dot_<format>_q8_K_generic``, the CPU backend's own (SIMD on this machine) Q8_0 / Q8_1
quantizers ``quantize_row_q8_0`` / ``quantize_row_q8_1`` (libggml-cpu): what llama.cpp runs on the
activations of Q8_0 / Q4_0 / Q5_0 / IQ4_NL and Q4_1 / Q5_1 weights, and its own (SIMD) Q4_1 / Q5_1 dot
products ``ggml_vec_dot_q4_1_q8_1`` / ``ggml_vec_dot_q5_1_q8_1``. ``quantize(x)``, ``quantize_q8_0(x)``,
``quantize_q8_1(x)``, ``dot(scheme, weight_row, x_row)`` and ``dot_q8_1(scheme, weight_row, x_blocks)``
skip the calling test when llama_cpp (or a symbol) is absent.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import llama_cpp_tools
import numpy as np
import pytest

__all__ = ["BLOCK_Q8_0", "BLOCK_Q8_1", "BLOCK_Q8_K", "dot", "dot_q8_1", "quantize", "quantize_q8_0", "quantize_q8_1"]

#: block_q8_0 and block_q8_1 (ggml-common.h): float16 d (and, for Q8_1, float16 s = d * sum qs), int8 qs[32]
BLOCK_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])
BLOCK_Q8_1 = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", (32,))])
assert BLOCK_Q8_0.itemsize == 34 and BLOCK_Q8_1.itemsize == 36

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


def _quantize_cpu(name: str, block: np.dtype, x: np.ndarray) -> np.ndarray:
    fn = _fn("libggml-cpu.so", name)
    fn.restype, fn.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    src = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(src.size // 32, block)
    fn(src.ctypes.data, out.ctypes.data, src.size)
    return out


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """ggml-cpu's quantize_row_q8_0 of one float32 row (k % 32 == 0): block_q8_0 records [k / 32]."""
    return _quantize_cpu("quantize_row_q8_0", BLOCK_Q8_0, x)


def quantize_q8_1(x: np.ndarray) -> np.ndarray:
    """ggml-cpu's quantize_row_q8_1 of one float32 row (k % 32 == 0): block_q8_1 records [k / 32]."""
    return _quantize_cpu("quantize_row_q8_1", BLOCK_Q8_1, x)


def _call_dot(fn: Any, n: int, weight_row: np.ndarray, x_blocks: np.ndarray) -> float:
    p, sz = ctypes.c_void_p, ctypes.c_size_t
    fn.restype, fn.argtypes = None, [ctypes.c_int, p, sz, p, sz, p, sz, ctypes.c_int]
    w = np.ascontiguousarray(weight_row, dtype=np.uint8)
    y = np.ascontiguousarray(x_blocks)
    s = np.zeros(1, np.float32)
    fn(n, s.ctypes.data, 0, w.ctypes.data, 0, y.ctypes.data, 0, 1)
    return float(s[0])


def dot_q8_1(scheme: str, weight_row: np.ndarray, x_blocks: np.ndarray) -> np.float32:
    """ggml-cpu's own ggml_vec_dot_q4_1_q8_1 / q5_1_q8_1 (SIMD on this machine) of one weight row (uint8
    blocks) and one row of block_q8_1 records."""
    fn = _fn("libggml-cpu.so", f"ggml_vec_dot_{scheme}_q8_1")
    return np.float32(_call_dot(fn, 32 * x_blocks.size, weight_row, x_blocks))


def dot(scheme: str, weight_row: np.ndarray, x_blocks: np.ndarray) -> float:
    """ggml_vec_dot_<scheme>_q8_K_generic of one weight row (uint8 super-blocks) and one Q8_K row."""
    name = {"iq4_xs": "iq4_xs"}.get(scheme, scheme.replace("_k", "_K"))
    fn = _fn("libggml-cpu.so", f"ggml_vec_dot_{name}_q8_K_generic")
    return _call_dot(fn, 256 * x_blocks.size, weight_row, x_blocks)
