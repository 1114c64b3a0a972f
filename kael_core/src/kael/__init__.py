"""kael: a small, readable deep-learning framework with pluggable backends.

``import kael`` never loads a plugin: backends load on first use of a device,
other plugins on first use of their feature (NOTE [lazy plugins]).
"""

from __future__ import annotations

from typing import Any

from . import autograd, backends
from ._device import Device
from ._device import Device as device
from ._dtype import (
    DType,
    bfloat16,
    float16,
    float32,
    float64,
    get_default_dtype,
    int8,
    int16,
    int32,
    int64,
    promote_types,
    result_type,
    set_default_dtype,
    uint8,
)
from ._dtype import bool_ as bool
from ._errors import (
    AutogradError,
    BackendError,
    ChatTemplateError,
    DeviceError,
    DTypeError,
    FormatError,
    IndexError_,
    KaelError,
    PluginError,
    ShapeError,
)
from ._tensor import Tensor, from_numpy
from .autograd import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from .backends import Backend
from .hookspecs import hookimpl, hookspec
from .ops import *  # noqa: F403
from .ops import __all__ as _ops_all

__version__ = "0.1.0"

__all__ = [
    "Tensor",
    "Device",
    "device",
    "DType",
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "promote_types",
    "result_type",
    "get_default_dtype",
    "set_default_dtype",
    "KaelError",
    "ShapeError",
    "DTypeError",
    "DeviceError",
    "BackendError",
    "FormatError",
    "IndexError_",
    "AutogradError",
    "PluginError",
    "ChatTemplateError",
    "from_numpy",
    "from_dlpack",
    "no_grad",
    "enable_grad",
    "set_grad_enabled",
    "inference_mode",
    "is_grad_enabled",
    "autograd",
    "backends",
    "Backend",
    "hookimpl",
    "hookspec",
    "__version__",
    *_ops_all,
]


def from_dlpack(x: Any) -> Tensor:
    """A tensor sharing memory with any DLPack producer (NumPy, PyTorch, CuPy...)."""
    import numpy as np

    dev = x.__dlpack_device__() if hasattr(x, "__dlpack_device__") else (1, 0)
    if dev[0] == 1:
        try:
            arr = np.from_dlpack(x)
        except (TypeError, BufferError, RuntimeError, AttributeError) as exc:
            raise DTypeError(f"from_dlpack: cannot import {type(x).__name__} through DLPack: {exc}") from None
        return from_numpy(arr)
    from . import _dispatch

    backend = _dispatch.backend_for("cuda")
    return backend.from_dlpack(x)  # type: ignore[no-any-return]


def __getattr__(name: str) -> Any:
    # Lazily reachable sub-packages (they import heavier modules).
    import importlib

    if name in ("nn", "optim", "io", "data", "models", "testing", "tokenizer", "debug", "cuda", "cpu", "quant"):
        return importlib.import_module(f"kael.{name}")
    if name == "quantize":  # kael.quant.quantize(model, scheme, ...)
        return importlib.import_module("kael.quant").quantize
    if name in ("HFTokenizer", "ChatTemplate", "load_tokenizer"):
        from . import tokenizer

        return getattr(tokenizer, name)
    if name in ("GPT", "BpeTokenizer", "load_safetensors", "save_safetensors", "set_num_threads", "get_num_threads"):
        from . import _lazy

        return getattr(_lazy, name)
    raise AttributeError(f"module 'kael' has no attribute {name!r}")
