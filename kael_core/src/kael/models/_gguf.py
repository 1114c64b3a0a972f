"""GGUF models: ``load_gguf`` (a llama.cpp GGUF file -> a kael model and its tokenizer) and
``save_gguf`` (a kael model -> a GGUF file llama.cpp loads), dispatched by ``general.architecture``.

Each architecture module (``_gguf_gpt2.py``: ``gpt2``; ``_gguf_llama.py``: ``llama``,
``qwen2``, ``qwen3``, ``granite``, ``smollm3``, ``olmo2``; ``_gguf_phi3.py``: ``phi3``; ``gemma3/_gguf.py``: ``gemma3``,
``gemma2``) reads its config from the ``{arch}.*``
metadata, builds the model, and lists every tensor of the file as a ``TensorSpec``: its GGUF name, the kael tensor it fills,
its shape in the file (row-major: GGUF's ``ne`` reversed, so a projection is ``[out, in]``)
and its role. Loading is strict: a missing, unexpected or misshapen tensor, a type the
role cannot take, an unknown architecture are each a ``FormatError`` naming the file and
the tensor or key, raised before any parameter is set.

NOTE [gguf weights]: a projection stored F32 becomes a float parameter; one stored F16,
BF16, Q8_0 or Q4_0 becomes a ``kael.quant.QuantizedLinear`` of that scheme whose weight
is the file's bytes (the Q8_0/Q4_0 blocks are GGML's, exactly ``kael.quant``'s layout, so
nothing is re-quantized). A token table stored in one of those types becomes the family's
``QuantizedTable`` (which is also the tied LM head). Norms, biases and GPT-2's position
table are float32 whatever their stored float type. ``model.weights_scheme`` is the
projections' scheme (None when they are all F32). ``save_gguf`` writes the same mapping
back: quantized modules keep their bytes, float ones are F32, or ``weights`` quantizes
them on the way out (NOTE [weights choice] in ``_weights.py``), the model untouched.

NOTE [gguf rope rows]: llama.cpp's converter reorders the rows of each Llama q/k
projection head from Hugging Face's rotate-half layout to GGML's interleaved one
(``permute`` in ``convert_hf_to_gguf.py``); ``rope_rows`` is that reordering as a row
index, undone on load and redone on save. It moves whole rows, so a quantized weight's
block rows move as they are (Granite's and SmolLM3's are permuted as Llama's). Qwen2, Qwen3 and OLMo 2 use NEOX rope in llama.cpp and are not permuted.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _dtype as dt
from .. import cpu
from .._errors import DTypeError, FormatError
from .._tensor import Tensor, from_numpy_bits
from ..autograd import no_grad
from ..nn import Module
from ..nn._module import _set_data
from ..ops import transpose
from ..quant import BLOCK_VALUES, SCHEMES
from ._generation_config import GenerationConfig
from ._weight_arena import gather_weights

if TYPE_CHECKING:
    from types import ModuleType

    from ..io import GGUFFile, GGUFTensor

__all__ = [
    "TensorSpec",
    "GGUF_SCHEMES",
    "FILE_TYPES",
    "ROLE_LINEAR",
    "ROLE_TABLE",
    "ROLE_FLOAT",
    "architectures",
    "load_gguf",
    "load_gguf_model",
    "rope_rows",
    "is_gguf_path",
    "meta_int",
    "meta_float",
]

GGUF_SCHEMES = {name.upper(): name for name in SCHEMES}
"""GGUF tensor types that are a ``kael.quant`` scheme: every registry format but F32 (a float parameter)."""
_TYPE_OF = {v: k for k, v in GGUF_SCHEMES.items()}
FILE_TYPES = {
    None: 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k_s": 11,
    "q3_k": 12, "q3_k_m": 12, "q3_k_l": 13, "q4_k_s": 14, "q4_k": 15, "q4_k_m": 15, "q5_k_s": 16, "q5_k": 17,
    "q5_k_m": 17, "q6_k": 18, "iq4_nl": 25, "iq4_xs": 30, "bf16": 32,
}  # fmt: skip
"""``general.file_type`` (llama.cpp's ``llama_ftype``) for a model's ``weights_scheme`` (a mix's own value; for
a uniform K-quant, the _M mix's, which is what a file of that majority usually is)."""
_FLOAT_TYPES = ("F32", "F16", "BF16")

ROLE_LINEAR = "linear"  # a projection's weight [out, in]: float parameter or QuantizedLinear
ROLE_TABLE = "table"  # the token embedding [V, C]: float parameter or the family's QuantizedTable
ROLE_FLOAT = "float"  # a norm, a bias, a position table: float32 always


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a GGUF model file and the kael tensor it is."""

    name: str
    """Its GGUF name (``blk.0.attn_qkv.weight``)."""
    target: str
    """The qualified name of the kael tensor (``h.0.attn.c_attn.weight``)."""
    shape: tuple[int, ...]
    """Its shape in the file, row-major (a projection ``[out, in]``)."""
    role: str = ROLE_FLOAT
    transpose: bool = False
    """The kael float parameter is stored ``[in, out]`` (GPT-2's Conv1D)."""
    rope_heads: int = 0
    """Rows reordered for GGML's rope in groups of this many heads (0: not; NOTE [gguf rope rows])."""
    optional: bool = False
    constant: bool = False
    """Not a model tensor: the family read it into the config and writes it back (``constant_tensor``)."""


def rope_rows(rows: int, heads: int) -> np.ndarray:
    """The row index ``perm`` with ``hf = gguf[perm]`` for a q/k projection of ``heads`` heads (NOTE [gguf rope rows])."""
    d = rows // heads
    idx = np.arange(rows).reshape(heads, d // 2, 2)  # GGUF row h*D + 2j + s ...
    return np.ascontiguousarray(idx.transpose(0, 2, 1).reshape(-1))  # ... is Hugging Face's row h*D + s*D/2 + j


def meta_int(metadata: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    """A positive integer metadata value (``default`` when absent and given); FormatError naming the key."""
    v = metadata.get(key, default)
    if v is None:
        raise FormatError(f"{where}: missing metadata key {key!r}")
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise FormatError(f"{where}: metadata {key!r} must be a positive integer, got {v!r}")
    return v


def meta_float(metadata: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    """A finite number metadata value (``default`` when absent and given); FormatError naming the key."""
    v = metadata.get(key, default)
    if v is None:
        raise FormatError(f"{where}: missing metadata key {key!r}")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
        raise FormatError(f"{where}: metadata {key!r} must be a finite number, got {v!r}")
    if isinstance(v, float) and float(np.float32(v)) == v:
        return float(str(np.float32(v)))  # a float32 value as written (1e-05, not 9.999999747378752e-06)
    return float(v)


def _arch_modules() -> list[ModuleType]:
    from . import _gguf_gpt2, _gguf_llama, _gguf_phi3, _gguf_qwen3moe
    from .gemma3 import _gguf as _gguf_gemma

    # phi3's and Gemma's before llama's: their models are LlamaForCausalLMs
    return [_gguf_gpt2, _gguf_phi3, _gguf_gemma, _gguf_llama, _gguf_qwen3moe]


def architectures() -> tuple[str, ...]:
    """The ``general.architecture`` values ``load_gguf`` reads."""
    return tuple(a for m in _arch_modules() for a in m.ARCHITECTURES)


def _arch_module(arch: Any, where: str) -> ModuleType:
    for m in _arch_modules():
        if arch in m.ARCHITECTURES:
            return m
    if arch is None:
        raise FormatError(f"{where}: no metadata key 'general.architecture'")
    raise FormatError(f"{where}: general.architecture {arch!r} is not supported (kael reads {sorted(architectures())})")


def is_gguf_path(path: Any) -> bool:
    """Whether ``path`` names a file ending in ``.gguf`` (what ``from_pretrained`` hands to ``load_gguf``)."""
    try:
        p = Path(path)
    except TypeError:
        return False
    return p.suffix.lower() == ".gguf" and not p.is_dir()


# -- loading ---------------------------------------------------------------------------------------


def _submodule(model: Module, name: str) -> Module:
    m = model
    for part in name.split(".") if name else ():
        m = getattr(m, part)
    return m


def _split(target: str) -> tuple[str, str]:
    owner, _, attr = target.rpartition(".")
    return owner, attr


def _float32(t: GGUFTensor) -> np.ndarray:
    """A stored tensor's values as a new float32 array of its logical shape."""
    if t.type == "F32":
        return np.array(t.data, dtype=np.float32)
    if t.type == "F16":
        return t.data.astype(np.float32)
    if t.type == "BF16":
        return (t.data.astype(np.uint32) << 16).view(np.float32)
    from ..quant import dequantize_array

    return np.asarray(dequantize_array(t.data, GGUF_SCHEMES[t.type], t.shape[-1]), dtype=np.float32)


def _stored(t: GGUFTensor, perm: np.ndarray | None) -> np.ndarray:
    """The stored bytes of a quantized tensor (uint8 blocks, uint16 bf16 bits, float16): a view of the file's
    mapping, or its rows permuted (a copy). A load without ``mmap`` copies each into the weight arena once, at
    its end (``gather_weights``); copying here too held every weight twice while loading."""
    if perm is not None:
        return np.ascontiguousarray(t.data[perm])
    return t.data


def _check(specs: list[TensorSpec], f: GGUFFile, where: str) -> dict[str, TensorSpec]:
    """The specs by GGUF name, after checking the file's tensors against them (one FormatError for all)."""
    by_name = {s.name: s for s in specs}
    problems: list[str] = []
    missing = [s.name for s in specs if not s.optional and s.name not in f.tensors]
    unexpected = [n for n in f.tensors if n not in by_name]
    if missing:
        problems.append(f"missing tensor(s) {missing}")
    if unexpected:
        problems.append(f"unexpected tensor(s) {unexpected}")
    for name, t in f.tensors.items():
        spec = by_name.get(name)
        if spec is None:
            continue
        if t.shape != spec.shape:
            problems.append(f"tensor {name!r} has shape {list(t.shape)}, the config needs {list(spec.shape)}")
        elif spec.role == ROLE_FLOAT and t.type not in _FLOAT_TYPES:
            problems.append(f"tensor {name!r} has type {t.type}, expected one of {list(_FLOAT_TYPES)}")
        elif spec.role != ROLE_FLOAT and t.type not in ("F32", *GGUF_SCHEMES):
            problems.append(f"tensor {name!r} has type {t.type}, expected one of {['F32', *GGUF_SCHEMES]}")
        elif GGUF_SCHEMES.get(t.type) in BLOCK_VALUES and t.shape[-1] % BLOCK_VALUES[GGUF_SCHEMES[t.type]]:
            bv = BLOCK_VALUES[GGUF_SCHEMES[t.type]]
            problems.append(f"tensor {name!r} is {t.type} with rows of {t.shape[-1]} values, not a multiple of {bv}")
    if problems:
        raise FormatError(f"{where}: " + "; ".join(problems))
    return by_name


def _set_float(
    model: Module, spec: TensorSpec, t: GGUFTensor, device: Any, perm: np.ndarray | None, f: GGUFFile
) -> None:
    from ..ops import empty, tensor

    owner, attr = _split(spec.target)
    dst = getattr(_submodule(model, owner), attr)
    if t.type == "F32" and getattr(device, "type", str(device).split(":")[0]) == "cpu":
        # One copy, from the file's mapping into the parameter's memory (a float32 file's every weight): the
        # new model's own (uninitialised) parameter where its layout is the file's, else a new one.
        own = not spec.transpose and dst.dtype is dt.float32 and dst.device.type == "cpu"
        own = own and tuple(dst.shape) == tuple(t.shape) and dst.is_contiguous()
        src = dst if own else empty(tuple(t.shape), dtype=dt.float32)
        if perm is None:
            np.copyto(src._np_view(), t.data)
        else:
            np.take(t.data, perm, axis=0, out=src._np_view())
        f.release_pages(t.data)  # copied: the file's pages need not stay in this process
        if own:
            return
    else:
        arr = _float32(t)
        if perm is not None:
            arr = np.ascontiguousarray(arr[perm])
        src = tensor(arr, dtype=dt.float32, device=device)
    if spec.transpose:  # NOTE [conv1d layout] in gpt2/_checkpoint.py: [in, out] over out-major memory
        src = transpose(src, 0, 1)
    _set_data(dst, src)


def _weight_tensor(data: np.ndarray, scheme: str, device: Any) -> Tensor:
    if getattr(device, "type", str(device).split(":")[0]) == "cpu":
        dtype = {"bf16": dt.bfloat16, "f16": dt.float16}.get(scheme, dt.uint8)
        # A view: of the file's mapping (read-only; without mmap, gather_weights moves it into the weight arena
        # as the load's last step) or of a permuted copy.
        return from_numpy_bits(data, dtype)
    from ..quant import to_device_weight

    return to_device_weight(data, scheme, device)


def _set_linear(model: Module, spec: TensorSpec, t: GGUFTensor, device: Any, perm: np.ndarray | None) -> None:
    from ..quant import QuantizedLinear

    scheme = GGUF_SCHEMES[t.type]
    module_name, _ = _split(spec.target)
    parent_name, attr = _split(module_name)
    parent = _submodule(model, parent_name)
    old = getattr(parent, attr)
    out_f, in_f = spec.shape
    has_bias = getattr(old, "bias", None) is not None
    weight = _weight_tensor(_stored(t, perm), scheme, device)
    q = QuantizedLinear(in_f, out_f, scheme, bias=has_bias, device=device, weight=weight)
    setattr(parent, attr, q)


def _set_table(model: Module, spec: TensorSpec, t: GGUFTensor, device: Any) -> bool:
    """The token table as the family's QuantizedTable; False when the family has none (then it loads as float)."""
    if not callable(getattr(model, "quantize_embeddings", None)):
        return False
    from ._weights import QuantizedTable

    scheme = GGUF_SCHEMES[t.type]
    module_name, _ = _split(spec.target)
    parent_name, attr = _split(module_name)
    v, c = spec.shape
    table = QuantizedTable(v, c, scheme, device=device)
    table.weight = _weight_tensor(_stored(t, None), scheme, device)
    setattr(_submodule(model, parent_name), attr, table)
    return True


def _generation_config(metadata: Mapping[str, Any]) -> GenerationConfig:
    def tid(key: str) -> int | None:
        v = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return v if type(v) is int else None

    eos = tuple(i for i in (tid("eos"), tid("eot")) if i is not None)
    return GenerationConfig(
        eos_token_ids=tuple(dict.fromkeys(eos)), bos_token_id=tid("bos"), pad_token_id=tid("padding")
    )


def _read_model(f: GGUFFile, device: Any, mmap: bool) -> Any:
    where = f"GGUF file {f.path!r}"
    arch = f.metadata.get("general.architecture")
    fam = _arch_module(arch, where)
    config = fam.config_from_metadata(arch, f.metadata, f.tensors, where)
    by_name = _check(fam.tensor_specs(config), f, where)
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and tokens and len(tokens) != config.vocab_size:
        raise FormatError(  # llama.cpp refuses this too: a token id must be a row of the table
            f"{where}: tokenizer.ggml.tokens has {len(tokens)} tokens, the model's vocabulary "
            f"(token_embd.weight rows) is {config.vocab_size}"
        )
    model = fam.new_model(config, device)
    fam.check_extra(f, where)
    schemes: Counter[str] = Counter()
    with no_grad():
        # Projections first: a bias then lands in the module that replaced a float projection.
        order = sorted(f.tensors.items(), key=lambda kv: by_name[kv[0]].role != ROLE_LINEAR)
        for name, t in order:
            spec = by_name[name]
            if spec.constant or fam.skip_tensor(spec):
                continue
            own = getattr(fam, "load_tensor", None)  # a family's own layout (qwen3moe's quantized expert stacks)
            if own is not None and own(model, spec, t, device, mmap):
                schemes[GGUF_SCHEMES[t.type]] += 1
                continue
            perm = rope_rows(spec.shape[0], spec.rope_heads) if spec.rope_heads else None
            if spec.role == ROLE_LINEAR and t.type in GGUF_SCHEMES:
                _set_linear(model, spec, t, device, perm)
                schemes[GGUF_SCHEMES[t.type]] += 1
            elif spec.role == ROLE_TABLE and t.type in GGUF_SCHEMES and _set_table(model, spec, t, device):
                pass
            else:
                _set_float(model, spec, t, device, perm, f)
    model.weights_scheme = schemes.most_common(1)[0][0] if schemes else None
    fam.finish(model, mmap)
    on_quantized = getattr(model, "on_quantized", None)
    if model.weights_scheme is not None and callable(on_quantized):
        on_quantized()  # (fused q/k/v, gate/up: copies of the file's parts, whose pages it read)
    if not mmap:  # NOTE [weight arena]: every stored weight, the file's mapped bytes included, moves to the arena
        f.release_pages()  # what was read so far has been copied; the rest comes back page by page
        freed = 0

        def moved(src: np.ndarray) -> None:
            nonlocal freed
            f.release_pages(src)  # a view of the file, or (no-op) a fused buffer, which goes with this call
            freed += src.nbytes
            if freed >= 64 << 20:  # the fused buffers moved so far, from the CPU allocator's cache
                cpu.empty_cache()
                freed = 0

        gather_weights(model.modules(), mapped=True, moved=moved)
    model.generation_config = _generation_config(f.metadata)
    return model.eval()


def load_gguf_model(
    path: Any, device: Any = "cpu", *, weights: Any = None, mmap: bool = False, dtype: Any = None
) -> Any:
    """The model of a GGUF file without its tokenizer (``load_gguf``'s first value); ``dtype``
    (``from_pretrained``'s) must be None or float32: a GGUF model computes in float32."""
    if dtype is not None and ((isinstance(dtype, str) and dtype == "auto") or dt.as_dtype(dtype) is not dt.float32):
        raise DTypeError(f"load_gguf: a GGUF model computes in float32; dtype must be None or float32, got {dtype!r}")
    return _load(path, device, weights=weights, mmap=mmap, with_tokenizer=False)[0]


def load_gguf(path: Any, device: Any = "cpu", *, weights: Any = None, mmap: bool = False) -> tuple[Any, Any]:
    """The model and tokenizer of a llama.cpp GGUF file: ``(model, tokenizer)``, the model in eval mode.

    ``general.architecture`` ``gpt2`` gives a ``kael.models.GPT``, ``llama`` and ``qwen2`` a
    ``LlamaForCausalLM``, ``qwen3`` a ``kael.models.qwen3.Qwen3ForCausalLM``, ``granite`` a
    ``kael.models.granite.GraniteForCausalLM``, ``smollm3`` a ``kael.models.smollm3.SmolLM3ForCausalLM``, ``olmo2`` a
    ``kael.models.olmo2.Olmo2ForCausalLM``, ``gemma3`` a ``kael.models.gemma3.Gemma3ForCausalLM``, ``gemma2`` a
    ``kael.models.gemma2.Gemma2ForCausalLM``;
    weights as NOTE [gguf weights] says. ``weights`` (None keeps the file's) is ``from_pretrained``'s choice (NOTE [weights choice]): an F32 file is quantized
    to it, a file already quantized otherwise is refused. ``mmap=True`` keeps the stored
    weights of a CPU model as read-only views of the file instead of copies. The tokenizer is
    ``kael.tokenizer.tokenizer_from_gguf``'s (None when the file has none). Every problem
    with the file is a ``FormatError`` naming it.
    """
    return _load(path, device, weights=weights, mmap=mmap, with_tokenizer=True)


def _load(path: Any, device: Any, *, weights: Any, mmap: bool, with_tokenizer: bool) -> tuple[Any, Any]:
    from ..io import read_gguf
    from ._weights import apply_weights, check_weights

    check_weights(weights, "load_gguf")
    p = Path(path)
    if not p.is_file():
        raise FormatError(f"load_gguf: {os.fspath(p)!r} is not a file")
    f = read_gguf(p)
    try:
        model = _read_model(f, device, mmap)
        tokenizer = None
        kind = f.metadata.get("tokenizer.ggml.model")
        if with_tokenizer and kind not in (None, "none", "no_vocab"):
            from ..tokenizer import tokenizer_from_gguf

            tokenizer = tokenizer_from_gguf(f.metadata, f"GGUF file {f.path!r}")
    finally:
        f.close()  # arrays still in use keep the mapping alive (kael.io.read_gguf)
    del f  # the header's vocabulary and the tensors' first copies go before the trim
    model = apply_weights(model, weights, "load_gguf")
    # The blocks the moved weights and the parsed header left, which the CPU allocator and the C heap would keep
    # for reuse (NOTE [heap trim] in kael_backend_cpu's allocator.cpp): without this a load kept twice the file.
    cpu.empty_cache()
    return model, tokenizer
