"""Weight formats of a model family: ``from_pretrained(weights=...)``, quantized token tables, quantized checkpoints.

NOTE [weights choice]: ``weights`` is one of ``WEIGHTS`` (``"f32"`` or None: float weights as
loaded; a format such as ``"bf16"``, ``"q8_0"``, ``"q4_k"``; or a llama.cpp file type such as
``"q4_k_m"``). It follows ``llama-quantize MODEL OUT TYPE`` without an importance matrix
(``kael.models._weights_plan``, NOTE [quantization mixes]): every projection and the token
embedding take the format (a mix gives some ``attn_v``/``ffn_down`` tensors more bits); norms,
biases and position embeddings (GPT-2's ``wpe``) stay float32; the output head takes Q6_K under
every block format but q8_0 (Q8_0 there, and where Q6_K's 256-value blocks do not fit its rows),
and a token table that is also the head (tied) follows the head's rule, as llama.cpp quantizes a
shared tensor as the output; rows a format's blocks do not fit fall back as llama.cpp's do. A
float format (bf16, f16) applies to the head too. Activations stay float32, so a quantized model
computes in float32.

A family supplies ``quantization_plan(weights)`` (module name -> format), ``quantize_embeddings(
scheme)`` (its token table becomes a ``QuantizedTable``, an untied head still float becomes a
``QuantizedLinear``) and ``on_quantized()``; ``apply_weights`` runs ``kael.quantize`` with them
and records ``model.weights_scheme``.

NOTE [quantized checkpoint]: a quantized model's ``model.safetensors`` holds the buffers of
each ``QuantizedLinear`` / ``QuantizedTable`` under the module's checkpoint key (uint8 blocks
as U8 ``[out, in/32*B]``, bf16/f16 as BF16/F16 ``[out, in]``), and its safetensors metadata
``"kael.quantization"`` is JSON ``{"version": 1, "tensors": {KEY: {"scheme": S, "shape": [out,
in]}}}`` naming every quantized tensor and its logical shape; ``"kael.weights"`` records the
model's ``weights`` choice. ``read_quantization`` validates it strictly (FormatError naming the
file and key); the families rebuild those modules before loading (``quantized_modules``).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .. import _dtype as dt
from .._errors import DTypeError, FormatError, KaelError, ShapeError
from .._tensor import Tensor
from ..nn import Module
from ..ops import detach, index_select, reshape, view
from ..quant import BLOCK_BYTES, BLOCK_VALUES, quantizable
from ..quant.formats import MIXES

__all__ = [
    "WEIGHTS",
    "BLOCK_SCHEMES",
    "QUANTIZATION_KEY",
    "WEIGHTS_KEY",
    "QuantizedSpec",
    "QuantizedTable",
    "apply_weights",
    "check_weights",
    "check_weights_dtype",
    "is_quantized",
    "module_scheme",
    "quantization_metadata",
    "quantized_modules",
    "read_quantization",
    "replace_module",
    "QuantizedCheckpoint",
    "stored_shape",
]

WEIGHTS = ("f32", *quantizable(), *(mix for mix in MIXES if mix not in quantizable()))
"""The ``weights`` choices of ``from_pretrained``, ``python -m kael generate``, ``export-gguf`` and ``kael-server``:
f32, every format kael can quantize to (``kael.quant.quantizable()``) and llama.cpp's mixes
(``kael.quant.formats.MIXES``); a test checks they agree."""
BLOCK_SCHEMES = dict(BLOCK_BYTES)
"""Bytes per block of every block format of the registry (``kael.quant.BLOCK_BYTES``)."""
_WEIGHT_DTYPES = {"bf16": dt.bfloat16, "f16": dt.float16}
_SCHEMES = (*BLOCK_SCHEMES, *_WEIGHT_DTYPES)
QUANTIZATION_KEY = "kael.quantization"
WEIGHTS_KEY = "kael.weights"


def check_weights(weights: Any, where: str = "from_pretrained") -> str | None:
    """``weights`` as a scheme of ``kael.quantize`` (None for float weights); a KaelError unless one of WEIGHTS."""
    if weights is None:
        return None
    if not isinstance(weights, str) or weights not in WEIGHTS:
        raise KaelError(f"{where}: weights must be None or one of {list(WEIGHTS)}, got {weights!r}")
    return None if weights == "f32" else weights


def check_weights_dtype(scheme: str | None, dtype: Any, where: str = "from_pretrained") -> None:
    """A quantized model computes in float32: ``dtype`` must then be None or float32."""
    if scheme is None or dtype is None:
        return
    if isinstance(dtype, str) and dtype == "auto":
        raise DTypeError(
            f"{where}: dtype='auto' cannot be combined with weights={scheme!r} (which computes in float32)"
        )
    if dt.as_dtype(dtype) is not dt.float32:
        raise DTypeError(
            f"{where}: weights={scheme!r} computes in float32 (norms, biases, activations); "
            f"dtype must be None or float32, got {dt.as_dtype(dtype)!r}"
        )


def stored_shape(scheme: str, shape: tuple[int, int]) -> tuple[int, int]:
    """The shape of the tensor that holds a [N, K] matrix in ``scheme`` (uint8 blocks or [N, K])."""
    n, k = shape
    b = BLOCK_SCHEMES.get(scheme)
    return (n, k // BLOCK_VALUES[scheme] * b) if b is not None else (n, k)


def _stored_dtype(scheme: str) -> dt.DType:
    return _WEIGHT_DTYPES.get(scheme, dt.uint8)


class QuantizedTable(Module):
    """A token table stored in a weight format: ``weight`` (uint8 blocks [V, C/32*B], or bf16/f16 [V, C]).

    ``forward(ids)`` is the embedding: the ids' rows of ``weight``, dequantized (float32
    ``[*ids.shape, C]``); ``project(x)`` is the tied LM head over the same rows,
    ``quantized_linear(x, weight)`` (logits [.., V]).
    """

    def __init__(self, num_embeddings: int, dim: int, scheme: str, device: Any = None) -> None:
        super().__init__()
        from ..ops import empty

        if scheme not in (*BLOCK_SCHEMES, *_WEIGHT_DTYPES):
            raise KaelError(
                f"QuantizedTable: scheme must be one of {[*BLOCK_SCHEMES, *_WEIGHT_DTYPES]}, got {scheme!r}"
            )
        if scheme in BLOCK_SCHEMES and dim % BLOCK_VALUES[scheme]:
            raise ShapeError(
                f"QuantizedTable: dim must be a multiple of {BLOCK_VALUES[scheme]} for {scheme!r}, got {dim}"
            )
        self.num_embeddings, self.dim, self.scheme = num_embeddings, dim, scheme
        shape = stored_shape(scheme, (num_embeddings, dim))
        self.register_buffer("weight", empty(shape, dtype=_stored_dtype(scheme), device=device))

    @classmethod
    def from_float(cls, weight: Tensor, scheme: str) -> QuantizedTable:
        """The table ``weight [V, C]`` (float) in ``scheme``."""
        from ..quant import quantize_array, to_device_weight

        v, c = weight.shape
        table = cls(v, c, scheme, device=weight.device)
        data = quantize_array(np.asarray(detach(weight)._host(), dtype=np.float32), scheme)  # on the host
        table.weight = to_device_weight(data, scheme, weight.device)
        return table

    def forward(self, ids: Tensor) -> Tensor:
        from ..ops import dequantize

        rows = index_select(self.weight, 0, reshape(ids, ids.numel()))
        return view(dequantize(rows, self.scheme), *ids.shape, self.dim)

    def project(self, x: Tensor) -> Tensor:
        """The tied LM head: x [.., C] -> logits [.., V]."""
        from ..ops import quantized_linear

        return quantized_linear(x, self.weight, None, self.scheme)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.dim}, scheme={self.scheme!r}"


def module_scheme(module: Any) -> str | None:
    """The weight scheme of a QuantizedLinear or QuantizedTable (None for a float module)."""
    scheme = getattr(module, "scheme", None) if isinstance(module, Module) else None
    return scheme if isinstance(scheme, str) and scheme in _SCHEMES else None


def is_quantized(model: Module) -> bool:
    """Whether any module of ``model`` holds its weight in a weight format."""
    return any(module_scheme(m) is not None for m in model.modules())


def apply_weights(model: Any, weights: Any, where: str = "from_pretrained") -> Any:
    """``model`` with its weights in ``weights`` (NOTE [weights choice]), in place; returns it.

    A model already in that format is returned as it is; one in another format is refused
    (requantizing stacks two roundings: load the float checkpoint instead).
    """
    scheme = check_weights(weights, where)
    if weights is None:
        return model
    have = getattr(model, "weights_scheme", None)
    if have is None and is_quantized(model):
        have = "quantized"
    if scheme == have:
        return model
    if have is not None:
        raise KaelError(
            f"{where}: the checkpoint already holds {have} weights; weights={weights!r} would requantize "
            "them, a second rounding (load the float checkpoint, or leave weights unset)"
        )
    if scheme is None:
        return model
    from ..quant import quantize

    if model.dtype is not dt.float32:
        raise DTypeError(f"{where}: weights={scheme!r} needs a float32 model, got {model.dtype!r}")
    has_table = callable(getattr(model, "quantize_embeddings", None))
    skip = ("lm_head",) if has_table and isinstance(getattr(model, "lm_head", None), Module) else ()
    quantize(model, scheme, embeddings=True, skip=skip)
    model.weights_scheme = scheme
    return model


# -- quantized checkpoints (NOTE [quantized checkpoint]) ---------------------------------------
class QuantizedSpec(NamedTuple):
    """One quantized tensor of a checkpoint: its scheme and its logical [out, in] shape."""

    scheme: str
    shape: tuple[int, int]


def quantization_metadata(model: Module, key_of: Any) -> dict[str, str]:
    """The safetensors metadata of ``model``'s quantized modules: ``{QUANTIZATION_KEY: json, WEIGHTS_KEY: s}``
    (empty for a float model). ``key_of(module_name)`` is the checkpoint key of a module's weight."""
    tensors: dict[str, dict[str, Any]] = {}
    for name, m in model.named_modules():
        scheme = module_scheme(m)
        if scheme is None:
            continue
        shape = [m.num_embeddings, m.dim] if isinstance(m, QuantizedTable) else [m.out_features, m.in_features]
        tensors[key_of(name)] = {"scheme": scheme, "shape": shape}
    if not tensors:
        return {}
    meta = {QUANTIZATION_KEY: json.dumps({"version": 1, "tensors": tensors}, sort_keys=True)}
    scheme = getattr(model, "weights_scheme", None)
    if isinstance(scheme, str):
        meta[WEIGHTS_KEY] = scheme
    return meta


def _first_file(d: Path) -> Path | None:
    from ..io import INDEX_NAME, SINGLE_NAME, read_checkpoint_entries

    single = d / SINGLE_NAME
    if single.is_file():
        return single
    if not (d / INDEX_NAME).is_file():
        return None
    files = sorted({e.file for e in read_checkpoint_entries(d).values()})
    return d / files[0] if files else None


def _header_metadata(path: Path) -> dict[str, str]:
    from ..io._safetensors_load import _open_header

    where = f"safetensors file {os.fspath(path)!r}"
    try:
        with open(path, "rb") as f:
            header, _ = _open_header(f, where)
    except OSError as exc:
        raise FormatError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    return dict(header.metadata or {})


class QuantizedCheckpoint(NamedTuple):
    """What a checkpoint's metadata declares: its quantized tensors (empty for a float checkpoint), its
    ``weights`` choice (None for a float one) and ``where``, the file holding the metadata, for errors."""

    specs: dict[str, QuantizedSpec]
    weights: str | None
    where: str


def read_quantization(directory: Any) -> QuantizedCheckpoint:
    """The quantized tensors a checkpoint directory declares (empty for a float one) and its weights choice.

    Every malformation is a FormatError naming the file and the key: metadata that is not a
    JSON object of version 1 with a ``tensors`` object, an unknown scheme, a shape that is not
    two positive ints (in a multiple of 32 for the block schemes).
    """
    path = _first_file(Path(directory))
    if path is None:
        return QuantizedCheckpoint({}, None, f"checkpoint {os.fspath(directory)!r}")
    file = f"checkpoint {os.fspath(path)!r}"
    meta = _header_metadata(path)
    raw = meta.get(QUANTIZATION_KEY)
    where = f"{file}: metadata {QUANTIZATION_KEY!r}"
    if raw is None:
        return QuantizedCheckpoint({}, None, file)
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{where} is not JSON ({exc})") from None
    if not isinstance(obj, dict) or obj.get("version") != 1 or not isinstance(obj.get("tensors"), dict):
        raise FormatError(f'{where}: expected {{"version": 1, "tensors": {{...}}}}, got {_short(obj)}')
    specs: dict[str, QuantizedSpec] = {}
    for key, entry in obj["tensors"].items():
        if not isinstance(entry, dict) or set(entry) != {"scheme", "shape"}:
            raise FormatError(
                f"{where}: tensor {key!r} must be {{'scheme': ..., 'shape': [out, in]}}, got {_short(entry)}"
            )
        scheme, shape = entry["scheme"], entry["shape"]
        if scheme not in (*BLOCK_SCHEMES, *_WEIGHT_DTYPES):
            raise FormatError(
                f"{where}: tensor {key!r} has scheme {scheme!r}, expected one of {[*BLOCK_SCHEMES, *_WEIGHT_DTYPES]}"
            )
        if (
            not isinstance(shape, list)
            or len(shape) != 2
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape)
        ):
            raise FormatError(f"{where}: tensor {key!r} has shape {_short(shape)}, expected [out, in] positive ints")
        if scheme in BLOCK_SCHEMES and shape[1] % BLOCK_VALUES[scheme]:
            raise FormatError(
                f"{where}: tensor {key!r} has shape {shape}; {scheme} needs in_features a multiple of "
                f"{BLOCK_VALUES[scheme]}"
            )
        specs[key] = QuantizedSpec(scheme, (shape[0], shape[1]))
    weights = meta.get(WEIGHTS_KEY)
    if weights is None:  # written by another tool: the scheme most tensors have
        weights = Counter(spec.scheme for spec in specs.values()).most_common(1)[0][0] if specs else None
    elif weights not in WEIGHTS or weights == "f32":
        raise FormatError(
            f"checkpoint {os.fspath(path)!r}: metadata {WEIGHTS_KEY!r} is {weights!r}, expected one of "
            f"{list(WEIGHTS[1:])} for a checkpoint with quantized tensors"
        )
    return QuantizedCheckpoint(specs, weights, file)


def _short(x: object) -> str:
    s = repr(x)
    return s if len(s) <= 80 else s[:77] + "..."


def quantized_modules(
    model: Module, specs: Mapping[str, QuantizedSpec], key_of: Any, where: str
) -> Iterator[tuple[str, Module, str, Module]]:
    """For each quantized tensor of ``specs``: (module name, parent, attribute, the empty quantized module).

    ``key_of(module_name)`` is the checkpoint key of a module's weight. A key that names no
    projection or token table of ``model``, or whose logical shape is not the module's, is
    a FormatError naming the file and the key.
    """
    from ..quant import QuantizedLinear

    by_key = {key_of(name): (name, m) for name, m in model.named_modules() if name}
    for key, spec in specs.items():
        found = by_key.get(key)
        if found is None:
            raise FormatError(f"{where}: metadata {QUANTIZATION_KEY!r} names {key!r}, which is no module of the model")
        name, m = found
        parent_name, _, attr = name.rpartition(".")
        parent = _submodule(model, parent_name)
        as_linear = getattr(m, "as_linear", None)
        if callable(as_linear):
            w, b = as_linear()
            want = (int(w.shape[0]), int(w.shape[1]))
            q: Module = QuantizedLinear(want[1], want[0], spec.scheme, bias=b is not None, device=w.device)
        elif callable(getattr(m, "project", None)) and isinstance(getattr(m, "weight", None), Tensor):
            want = (int(m.weight.shape[0]), int(m.weight.shape[1]))
            q = QuantizedTable(want[0], want[1], spec.scheme, device=m.weight.device)
        else:
            raise FormatError(
                f"{where}: metadata {QUANTIZATION_KEY!r} names {key!r}, which is not a projection or token table"
            )
        if spec.shape != want:
            raise FormatError(
                f"{where}: metadata {QUANTIZATION_KEY!r} gives {key!r} the shape {list(spec.shape)}, "
                f"the model's module is {list(want)}"
            )
        yield name, parent, attr, q


def replace_module(parent: Module, name: str, module: Module) -> None:
    """``parent.name = module``, keeping the child's place (so state_dict keeps its key order)."""
    if name in parent._modules:
        parent._modules[name] = module
    else:
        setattr(parent, name, module)


def _submodule(model: Module, name: str) -> Module:
    m = model
    for part in name.split(".") if name else ():
        m = getattr(m, part)
    return m
