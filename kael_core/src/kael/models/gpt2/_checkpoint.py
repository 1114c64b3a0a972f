"""GPT-2 checkpoints: ``read_config``, ``load_gpt2``, ``from_pretrained`` and ``save_pretrained``.

Two key layouts are read (NOTE [gpt2 key layouts]):

* Hugging Face's ``save_pretrained`` layout: every key prefixed ``transformer.``, the
  LM head tied to ``wte`` and so absent (``lm_head.weight``, when present, must equal
  ``wte.weight`` and is ignored);
* the bare layout of the published GPT-2 files: no prefix, plus the causal-mask buffers
  ``h.N.attn.bias`` and ``h.N.attn.masked_bias``, which hold no weights and are ignored.

Loading is strict: missing keys, unexpected keys and shape mismatches are all named in
one ``kael.FormatError``, raised before any parameter changes. Parameters keep their
identity and take the loaded tensors' memory (with ``mmap=True``, views into the file).
``save_pretrained`` writes the first layout with a ``config.json`` transformers reads.

NOTE [conv1d layout]: GPT-2's Conv1D weights are ``[in, out]`` and the forward pass hands
their transpose to ``linear``. A copy-mode load stores them out-major: the parameter is
still ``[in, out]``, a transposed view of ``[out, in]`` memory, so ``linear`` sees its
weight rows contiguous along ``in``. A product with few rows (decoding) then runs as dot
products that read each weight row once, front to back, all rows of the input at a time;
that is markedly faster for decoding than the ``[in, out]`` memory order, alone and
batched (``benchmarks/gpt2.py`` measures it). A mapped load keeps the file's order (no
copy is the point of mapping); both are correct.

A quantized model (NOTE [quantized checkpoint] in kael/models/_weights.py) is saved with its
``QuantizedLinear`` / ``QuantizedTable`` buffers under the module keys and the
``"kael.quantization"`` metadata; loading rebuilds those modules first, then loads
strictly as for a float one (each buffer with its exact stored shape and dtype).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ... import _dtype as dt
from ..._errors import FormatError
from ..._tensor import Tensor
from ...autograd import no_grad
from ...io import INDEX_NAME, load_checkpoint_tensors, load_safetensors, save_safetensors
from ...io._atomic import atomic_write
from ...nn._module import _set_data
from ...ops import contiguous, detach, to, transpose
from .._generation_config import read_generation_config
from .._registry import read_config_json
from .._weights import (
    apply_weights,
    check_weights,
    check_weights_dtype,
    quantization_metadata,
    quantized_modules,
    read_quantization,
    replace_module,
)
from ._config import GPTConfig
from ._model import GPT

__all__ = [
    "from_pretrained",
    "load_gpt2",
    "save_pretrained",
    "read_config",
    "hf_config",
    "PREFIX",
    "CONFIG_NAME",
    "WEIGHTS_NAME",
]

PREFIX = "transformer."
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
_MASK_BUFFER = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")
_CONV1D_WEIGHT = re.compile(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight")
# Activations that are the tanh form of GELU under Hugging Face's names.
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def _where(path: Any) -> str:
    return repr(os.fspath(path))


def read_config(path: Any) -> GPTConfig:
    """A GPTConfig from a Hugging Face GPT-2 ``config.json`` (a file or its directory)."""
    d, p = read_config_json(path, "GPT-2 config")

    def fail(msg: str) -> None:
        raise FormatError(f"GPT-2 config {_where(p)}: {msg}")

    if d.get("model_type", "gpt2") != "gpt2":
        fail(f"model_type is {d['model_type']!r}, expected 'gpt2'")
    if "n_positions" not in d and "n_ctx" in d:
        d["n_positions"] = d["n_ctx"]
    sizes = {}
    for key in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size"):
        if key not in d:
            fail(f"missing key {key!r}")
        v = d[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            fail(f"{key} must be a positive integer, got {v!r}")
        sizes[key] = v
    eps = d.get("layer_norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        fail(f"layer_norm_epsilon must be a number in (0, 1), got {eps!r}")
    if sizes["n_embd"] % sizes["n_head"]:
        fail(f"n_embd {sizes['n_embd']} is not divisible by n_head {sizes['n_head']}")
    act = d.get("activation_function", "gelu_new")
    if act not in _TANH_GELU:
        fail(f"activation_function {act!r} is not supported (expected one of {list(_TANH_GELU)})")
    inner = d.get("n_inner")
    if inner is not None and inner != 4 * sizes["n_embd"]:
        fail(f"n_inner {inner!r} is not supported (only 4 * n_embd = {4 * sizes['n_embd']})")
    for flag, want in (
        ("scale_attn_weights", True),
        ("scale_attn_by_inverse_layer_idx", False),
        ("add_cross_attention", False),
    ):
        if d.get(flag, want) != want:
            fail(f"{flag}={d[flag]!r} is not supported (expected {want!r})")
    return GPTConfig(
        vocab_size=sizes["vocab_size"],
        max_positions=sizes["n_positions"],
        layers=sizes["n_layer"],
        heads=sizes["n_head"],
        dimension=sizes["n_embd"],
        layer_norm_epsilon=float(eps),
    )


def hf_config(config: GPTConfig, dtype: dt.DType = dt.float32) -> dict[str, Any]:
    """A Hugging Face ``GPT2Config`` dictionary for ``config`` (GPT-2's published settings otherwise)."""
    eot = min(50256, config.vocab_size - 1)
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.max_positions,
        "n_ctx": config.max_positions,
        "n_embd": config.dimension,
        "n_layer": config.layers,
        "n_head": config.heads,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": config.layer_norm_epsilon,
        "resid_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "attn_pdrop": 0.1,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "use_cache": True,
        "dtype": dtype.name,
        "summary_type": "cls_index",
        "summary_use_proj": True,
        "summary_activation": None,
        "summary_proj_to_labels": True,
        "summary_first_dropout": 0.1,
    }


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and bool((a._host() == b._host()).all())


def _checkpoint_params(tensors: dict[str, Tensor], model: GPT, where: str) -> dict[str, Tensor]:
    """Map a checkpoint's tensors (either layout) onto the model's parameter and buffer names, strictly."""
    expected = model.state_dict()
    params = {name for name, _ in model.named_parameters()}
    prefixed = any(k.startswith(PREFIX) for k in tensors)
    prefix = PREFIX if prefixed else ""
    found: dict[str, Tensor] = {}
    unexpected: list[str] = []
    for key, t in tensors.items():
        if key == "lm_head.weight":
            continue  # checked against wte below
        name = key[len(prefix) :] if key.startswith(prefix) else None
        if name is None or (name not in expected and not _MASK_BUFFER.fullmatch(name)):
            unexpected.append(key)
        elif name in expected:
            found[name] = t
    missing = [prefix + n for n in expected if n not in found]
    problems = []
    if missing:
        problems.append(f"missing key(s) {missing}")
    if unexpected:
        problems.append(f"unexpected key(s) {unexpected}")
    for name, t in found.items():
        want = expected[name].shape
        if t.shape != want:
            problems.append(f"{prefix + name!r} has shape {list(t.shape)}, the model expects {list(want)}")
        elif name in params and not t.dtype.is_floating_point:
            problems.append(f"{prefix + name!r} has dtype {t.dtype.name}, expected a floating-point dtype")
        elif name not in params and t.dtype is not expected[name].dtype:  # a weight format's exact dtype
            problems.append(f"{prefix + name!r} has dtype {t.dtype.name}, expected {expected[name].dtype.name}")
    head = tensors.get("lm_head.weight")
    if head is not None and not problems and not _same(head, found["wte.weight"]):
        problems.append("'lm_head.weight' differs from 'wte.weight': an untied LM head is not supported")
    if problems:
        raise FormatError(
            f"GPT-2 checkpoint {where} does not fit {type(model).__name__}({model.extra_repr()}): "
            + "; ".join(problems)
        )
    return found


def load_gpt2(model: GPT, path: Any, *, mmap: bool = False) -> GPT:
    """Load GPT-2 weights (either key layout) from a safetensors file, or a checkpoint directory
    (its ``model.safetensors`` or sharded ``model.safetensors.index.json``, via
    ``kael.io.load_checkpoint_tensors``).

    Strict: every parameter must be present with its shape and nothing else may be,
    otherwise a FormatError names the keys. Values are cast to the model's dtype and
    moved to its device; parameters keep their identity.
    """
    p = Path(path)
    where = _where(p)
    if p.is_dir():
        tensors = load_checkpoint_tensors(p, mmap=mmap, device=model.device)
    elif p.is_file():
        tensors = load_safetensors(p, mmap=mmap, device=model.device)
    else:
        raise FormatError(f"GPT-2 checkpoint {where}: no such file")
    found = _checkpoint_params(tensors, model, where)
    del tensors  # each checkpoint tensor goes once its parameter holds it (or its out-major copy)
    with no_grad():
        for name, param in model.named_parameters():
            t = found.pop(name)
            if t.dtype is not param.dtype:
                t = to(t, dtype=param.dtype)
            if not mmap and _CONV1D_WEIGHT.fullmatch(name):  # NOTE [conv1d layout]
                t = transpose(contiguous(transpose(t, 0, 1)), 0, 1)
            _set_data(param, t)
        for name, buf in model.named_buffers():  # weights in a weight format, as stored
            _set_data(buf, found.pop(name))
    return model


def from_pretrained(
    directory: Any, device: Any = "cpu", *, mmap: bool = False, dtype: Any = None, weights: Any = None
) -> GPT:
    """A GPT from a directory holding ``config.json`` and ``model.safetensors`` (or its sharded index), in eval mode.

    ``model.generation_config`` is the directory's ``generation_config.json`` (empty when absent).
    ``weights`` (None, ``"f32"``, ``"bf16"``, ``"f16"``, ``"q8_0"``, ``"q4_0"``): the format of the
    weights after loading (NOTE [weights choice] in kael/models/_weights.py). A quantized
    checkpoint (``save_pretrained`` of a quantized model) loads as it was saved.
    """
    d = Path(directory)
    if not d.is_dir():
        raise FormatError(f"GPT.from_pretrained: {_where(d)} is not a directory")
    scheme = check_weights(weights, "GPT.from_pretrained")
    config = read_config(d / CONFIG_NAME)
    specs, stored, where = read_quantization(d)
    check_weights_dtype(stored or scheme, dtype, "GPT.from_pretrained")
    model = GPT.from_config(config, device=device, dtype=dtype, init=False)
    if specs:
        for _, parent, attr, module in list(quantized_modules(model, specs, _key, f"GPT-2 {where}")):
            replace_module(parent, attr, module)
        model.weights_scheme = stored
    load_gpt2(model, d if (d / INDEX_NAME).is_file() else d / WEIGHTS_NAME, mmap=mmap)
    model.generation_config = read_generation_config(d)
    return apply_weights(model.eval(), weights, "GPT.from_pretrained")  # type: ignore[no-any-return]


def _key(module_name: str) -> str:
    """The checkpoint key of a module's weight (the ``transformer.`` layout ``save_pretrained`` writes)."""
    return f"{PREFIX}{module_name}.weight"


def save_pretrained(model: GPT, directory: Any) -> None:
    """Write ``config.json`` and ``model.safetensors`` (``transformer.``-prefixed, head tied) to directory.

    Hugging Face transformers reads the result with ``GPT2LMHeadModel.from_pretrained``;
    so does ``GPT.from_pretrained``. Each file is written atomically.
    """
    if not isinstance(model, GPT):
        raise FormatError(f"save_pretrained: expected a kael GPT, got {type(model).__name__}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tensors = {PREFIX + name: detach(t) for name, t in model.state_dict().items()}
    metadata = {"format": "pt", **quantization_metadata(model, _key)}
    save_safetensors(tensors, d / WEIGHTS_NAME, metadata=metadata)
    text = json.dumps(hf_config(model.config, model.dtype), indent=2, sort_keys=True) + "\n"
    with atomic_write(d / CONFIG_NAME) as f:
        f.write(text.encode("utf-8"))
