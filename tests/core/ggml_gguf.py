"""llama.cpp's own GGUF parser (ggml's `gguf_init_from_file`) through ctypes, as a test oracle.

llama-cpp-python ships ggml's shared library; its C GGUF reader is the one llama.cpp
loads models with, so a file it reads (metadata, tensor infos and the whole data
section, read into a ggml context) is a file llama.cpp loads. `read(path)` returns
`None` when ggml refuses the file, else its version, alignment, metadata and tensors.
Tests call `library()` first, which skips when llama_cpp is not installed.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any

import llama_cpp_tools

__all__ = ["GgmlFile", "accepts", "library", "read"]

# gguf_type ids (ggml's gguf.h): scalar getters and ctypes element types
_SCALARS: dict[int, tuple[str, str, Any]] = {
    0: ("uint8", "u8", ctypes.c_uint8),
    1: ("int8", "i8", ctypes.c_int8),
    2: ("uint16", "u16", ctypes.c_uint16),
    3: ("int16", "i16", ctypes.c_int16),
    4: ("uint32", "u32", ctypes.c_uint32),
    5: ("int32", "i32", ctypes.c_int32),
    6: ("float32", "f32", ctypes.c_float),
    7: ("bool", "bool", ctypes.c_bool),
    10: ("uint64", "u64", ctypes.c_uint64),
    11: ("int64", "i64", ctypes.c_int64),
    12: ("float64", "f64", ctypes.c_double),
}
_STRING, _ARRAY = 8, 9


class _Params(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.POINTER(ctypes.c_void_p))]


_LIB: Any = None


def library() -> Any:
    """ggml's base library with the prototypes declared; skips the test when unavailable."""
    global _LIB
    if _LIB is not None:
        return _LIB
    lib = llama_cpp_tools.ggml_library("libggml-base.so")
    p, i64, c = ctypes.c_void_p, ctypes.c_int64, ctypes.c_char_p
    protos: dict[str, tuple[Any, list[Any]]] = {
        "gguf_init_from_file": (p, [c, _Params]),
        "gguf_free": (None, [p]),
        "gguf_get_version": (ctypes.c_uint32, [p]),
        "gguf_get_alignment": (ctypes.c_size_t, [p]),
        "gguf_get_n_kv": (i64, [p]),
        "gguf_get_key": (c, [p, i64]),
        "gguf_get_kv_type": (ctypes.c_int, [p, i64]),
        "gguf_get_arr_type": (ctypes.c_int, [p, i64]),
        "gguf_get_arr_n": (ctypes.c_size_t, [p, i64]),
        "gguf_get_arr_data": (p, [p, i64]),
        "gguf_get_arr_str": (c, [p, i64, ctypes.c_size_t]),
        "gguf_get_val_str": (c, [p, i64]),
        "gguf_get_n_tensors": (i64, [p]),
        "gguf_get_tensor_name": (c, [p, i64]),
        "gguf_get_tensor_type": (ctypes.c_int, [p, i64]),
        "gguf_get_tensor_offset": (ctypes.c_size_t, [p, i64]),
        "ggml_get_tensor": (p, [p, c]),
        "ggml_get_data": (p, [p]),
        "ggml_nbytes": (ctypes.c_size_t, [p]),
        "ggml_free": (None, [p]),
    }
    for _, (_, suffix, ctype) in _SCALARS.items():
        protos[f"gguf_get_val_{suffix}"] = (ctype, [p, i64])
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    _LIB = lib
    return lib


@dataclass
class GgmlFile:
    version: int
    alignment: int
    metadata: dict[str, tuple[str, Any]]  # key -> (type name, value)
    tensors: dict[str, tuple[int, int, bytes]]  # name -> (ggml type id, offset in the data section, bytes)


def _value(lib: Any, g: int, i: int) -> tuple[str, Any]:
    t = lib.gguf_get_kv_type(g, i)
    if t == _STRING:
        return "string", lib.gguf_get_val_str(g, i).decode("utf-8")
    if t != _ARRAY:
        name, suffix, _ = _SCALARS[t]
        return name, getattr(lib, f"gguf_get_val_{suffix}")(g, i)
    et, n = lib.gguf_get_arr_type(g, i), lib.gguf_get_arr_n(g, i)
    if et == _STRING:
        return "array[string]", [lib.gguf_get_arr_str(g, i, j).decode("utf-8") for j in range(n)]
    name, _, ctype = _SCALARS[et]
    ptr = lib.gguf_get_arr_data(g, i) if n else None
    return f"array[{name}]", list((ctype * n).from_address(ptr)) if n else []


def accepts(path: str | os.PathLike[str]) -> bool:
    """Whether ggml parses `path`, its data section read into a context."""
    lib = library()
    ctx = ctypes.c_void_p()
    g = lib.gguf_init_from_file(os.fspath(path).encode(), _Params(False, ctypes.pointer(ctx)))
    if g:
        lib.gguf_free(g)
    if ctx.value:
        lib.ggml_free(ctx)
    return bool(g)


def read(path: str | os.PathLike[str]) -> GgmlFile | None:
    """Parse `path` with ggml, data included; None when ggml refuses it."""
    lib = library()
    ctx = ctypes.c_void_p()
    g = lib.gguf_init_from_file(os.fspath(path).encode(), _Params(False, ctypes.pointer(ctx)))
    if not g:
        return None
    try:
        metadata = {lib.gguf_get_key(g, i).decode("utf-8"): _value(lib, g, i) for i in range(lib.gguf_get_n_kv(g))}
        tensors = {}
        for i in range(lib.gguf_get_n_tensors(g)):
            name = lib.gguf_get_tensor_name(g, i)
            t = lib.ggml_get_tensor(ctx, name)
            data = ctypes.string_at(lib.ggml_get_data(t), lib.ggml_nbytes(t))
            tensors[name.decode("utf-8")] = (lib.gguf_get_tensor_type(g, i), lib.gguf_get_tensor_offset(g, i), data)
        return GgmlFile(lib.gguf_get_version(g), lib.gguf_get_alignment(g), metadata, tensors)
    finally:
        lib.gguf_free(g)
        if ctx.value:
            lib.ggml_free(ctx)
