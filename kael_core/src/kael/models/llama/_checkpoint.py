"""Llama-family checkpoints: ``from_pretrained`` and ``save_pretrained`` in Hugging Face's layout.

A checkpoint directory holds ``config.json`` (``read_config``), the weights as
``model.safetensors`` or sharded ``model-0000N-of-0000M.safetensors`` with
``model.safetensors.index.json`` (``kael.io.load_checkpoint_tensors``), and optionally
``generation_config.json`` (``kael.models.read_generation_config``, attached as
``model.generation_config``). Loading is strict: the checkpoint's names and shapes are
checked against the model's parameters before any tensor is read, and a missing,
unexpected or misshapen tensor is a FormatError naming it. Two extras are accepted:
``lm_head.weight`` in a checkpoint whose config ties it (it must then equal
``model.embed_tokens.weight``), and the ``rotary_emb.inv_freq`` buffers older
transformers versions saved (kael computes the frequencies from the config). A family whose
checkpoints hold the model inside a larger one (Gemma 3's multimodal checkpoints) says where
with its class's ``checkpoint_layout`` (``CheckpointLayout``): the stored names are checked
and read as above (errors name them), the other parts' tensors are neither checked nor read.

``dtype``: None computes in float32 (whatever the stored dtype), ``"auto"`` keeps the
stored dtype of the embeddings (every weight converted to it), a kael dtype converts to it.

NOTE [fused projections]: a copy-mode load puts each layer's q/k/v projections (weights,
and biases when present) into one ``[(H + 2 Hkv) * D, C]`` buffer and gate/up into one
``[2F, C]`` buffer, the parameters being row blocks of it (no memory is doubled: each
buffer replaces the tensors it holds, one layer at a time). The parameters keep their
names, shapes and identity; ``LlamaDecodeStep`` sees that they are adjacent and runs one
product where it would run three (or two). A mapped load keeps the file's tensors (no
copy is the point of mapping) and the step runs the separate products; both are exact.
A quantized model's QuantizedLinear weights are fused the same way (``on_quantized``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ... import _dtype as dt
from ... import cpu
from ..._errors import DTypeError, FormatError
from ..._tensor import Tensor
from ...autograd import no_grad
from ...io import load_checkpoint_tensors, save_checkpoint_tensors
from ...io._atomic import atomic_write
from ...nn._module import _set_data
from ...ops import detach, empty, narrow, to
from ...ops._inplace import copy_
from .._generation_config import read_generation_config
from .._weights import (
    check_weights,
    check_weights_dtype,
    quantization_metadata,
    quantized_modules,
    read_quantization,
    replace_module,
)
from ._model import LlamaForCausalLM

__all__ = ["from_pretrained", "save_pretrained", "fuse_projections", "CONFIG_NAME"]

CONFIG_NAME = "config.json"
_HEAD = "lm_head.weight"


def _where(path: Any) -> str:
    return repr(os.fspath(path))


def _target_dtype(dtype: Any) -> dt.DType | None:
    """The dtype to load as: float32 for None, None (keep stored) for "auto", else a floating kael dtype."""
    if dtype is None:
        return dt.float32
    if isinstance(dtype, str) and dtype == "auto":
        return None
    d = dt.as_dtype(dtype)
    if not d.is_floating_point:
        raise DTypeError(f"LlamaForCausalLM.from_pretrained: dtype must be floating point, None or 'auto', got {d!r}")
    return d


def from_pretrained(
    directory: Any,
    device: Any = "cpu",
    *,
    mmap: bool = False,
    dtype: Any = None,
    weights: Any = None,
    model_class: type[LlamaForCausalLM] = LlamaForCausalLM,
) -> LlamaForCausalLM:
    """A LlamaForCausalLM from a Hugging Face llama/qwen2/mistral checkpoint directory, in eval mode.

    ``weights`` (None, ``"f32"``, ``"bf16"``, ``"f16"``, ``"q8_0"``, ``"q4_0"``): the format of the
    weights after loading (NOTE [weights choice] in kael/models/_weights.py). A quantized
    checkpoint (``save_pretrained`` of a quantized model, NOTE [quantized checkpoint]) loads as
    it was saved: its quantized modules are rebuilt, then every tensor is checked and loaded.
    ``model_class``: a family built on this one (a subclass, which reads its own ``config.json``).
    """
    d = Path(directory)
    if not d.is_dir():
        raise FormatError(f"LlamaForCausalLM.from_pretrained: {_where(d)} is not a directory")
    where = "LlamaForCausalLM.from_pretrained"
    scheme = check_weights(weights, where)
    config = model_class.read_config(d / CONFIG_NAME)
    specs, stored, file = read_quantization(d)
    check_weights_dtype(stored or scheme, dtype, where)
    target = _target_dtype(dtype)
    model = model_class(config, device=device, dtype=target or dt.float32, init=False)
    if specs:
        for _, parent, attr, module in list(quantized_modules(model, specs, _key, f"Llama {file}")):
            replace_module(parent, attr, module)
        model.weights_scheme = stored
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
    buffers = dict(model.named_buffers())  # weights in a weight format: exact dtype, checked below
    optional = [f"model.layers.{i}.self_attn.rotary_emb.inv_freq" for i in range(config.num_hidden_layers)]
    optional += list(buffers)
    if config.tie_word_embeddings:
        optional.append(_HEAD)
        if not specs:
            expected[_HEAD] = expected["model.embed_tokens.weight"]
    layout = model_class.checkpoint_layout(d)  # the checkpoint's names of the model's tensors: checked and read
    ours = {layout.stored(name): name for name in [*expected, *optional]}
    raw = load_checkpoint_tensors(
        d,
        device=model.device,
        dtype=None if specs else target,
        mmap=mmap,
        expected={layout.stored(name): shape for name, shape in expected.items()},
        optional=[layout.stored(name) for name in optional],
        ignore=layout.ignored,
    )
    tensors = {ours[key]: t for key, t in raw.items()}
    del raw
    _check_buffers(tensors, buffers, f"Llama {file}")
    if target is None:
        target = tensors["model.embed_tokens.weight"].dtype
    head = tensors.get(_HEAD) if config.tie_word_embeddings else None
    if head is not None and not _equal(head, tensors["model.embed_tokens.weight"]):
        raise FormatError(
            f"Llama checkpoint {_where(d)}: config.json ties the word embeddings but "
            f"{layout.stored(_HEAD)!r} differs from {layout.stored('model.embed_tokens.weight')!r}"
        )
    for name, param in model.named_parameters():
        t = tensors[name]
        _set_data(param, t if t.dtype is target else to(t, dtype=target))
    for name, buf in buffers.items():
        _set_data(buf, tensors[name])
    del tensors
    if not mmap:
        fuse_projections(model)
    model.generation_config = read_generation_config(d)
    return model.eval()


def _key(module_name: str) -> str:
    """The checkpoint key of a module's weight."""
    return f"{module_name}.weight"


def _check_buffers(tensors: dict[str, Tensor], buffers: dict[str, Tensor], where: str) -> None:
    """Every weight-format buffer is in the checkpoint with its exact stored shape and dtype."""
    problems = []
    for name, buf in buffers.items():
        t = tensors.get(name)
        if t is None:
            problems.append(f"missing tensor {name!r}")
        elif t.shape != buf.shape or t.dtype is not buf.dtype:
            problems.append(
                f"{name!r} is {t.dtype.name} {list(t.shape)}, its quantization metadata needs "
                f"{buf.dtype.name} {list(buf.shape)}"
            )
    if _HEAD in tensors and _HEAD not in buffers and any(n.startswith("model.embed_tokens.") for n in buffers):
        problems.append(f"{_HEAD!r} is not expected beside a quantized tied 'model.embed_tokens.weight'")
    if problems:
        raise FormatError(f"{where}: " + "; ".join(problems))


def fuse_projections(model: LlamaForCausalLM) -> None:
    """Put each layer's q/k/v and gate/up parameters into one buffer each (NOTE [fused projections])."""
    with no_grad():
        for blk in model.model.layers:
            a, m = blk.self_attn, blk.mlp
            if not hasattr(a, "q_proj"):  # a family whose checkpoint stores them fused (Phi-3): nothing to do
                continue
            _fuse([a.q_proj, a.k_proj, a.v_proj])
            if hasattr(m, "fuse"):  # a family's MLP with its own fused layout (Qwen3-MoE's stacked experts)
                m.fuse()
            else:
                _fuse([m.gate_proj, m.up_proj])
            # The layer's separate buffers are free now: give them back before the next layer's fused ones are
            # made (kept in the CPU allocator's cache, which no later size fits, a float32 load peaked at the
            # model, its fused copies and the file's mapping together).
            cpu.empty_cache()


def _fuse(projections: list[Any]) -> None:
    # Only projections of one kind (float, or one weight format) fuse: their rows then line up.
    if len({(type(p), getattr(p, "scheme", None)) for p in projections}) != 1:
        return
    for attr in ("weight", "bias"):
        parts: list[Tensor | None] = [getattr(p, attr) for p in projections]
        if any(t is None for t in parts):
            continue
        ts = [t for t in parts if t is not None]
        first = ts[0]
        if any(t.dtype is not first.dtype or t.shape[1:] != first.shape[1:] for t in ts):
            continue
        buf = empty((sum(t.shape[0] for t in ts), *first.shape[1:]), dtype=first.dtype, device=first.device)
        row = 0
        for t in ts:
            block = narrow(buf, 0, row, t.shape[0])
            copy_(block, t)
            _set_data(t, block)
            row += t.shape[0]


def _equal(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and bool((a._host() == b._host()).all())


def save_pretrained(model: LlamaForCausalLM, directory: Any) -> None:
    """Write ``config.json`` and the weights (``model.safetensors``) in Hugging Face's layout.

    transformers reads the result with ``AutoModelForCausalLM.from_pretrained`` (the
    architecture of its model_type); so does ``kael.models.from_pretrained``. Each file is
    written atomically.
    """
    if not isinstance(model, LlamaForCausalLM):
        raise FormatError(f"save_pretrained: expected a kael LlamaForCausalLM, got {type(model).__name__}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tensors = {name: detach(t) for name, t in model.state_dict().items()}
    save_checkpoint_tensors(d, tensors, metadata={"format": "pt", **quantization_metadata(model, _key)})
    text = json.dumps(model.hf_config(), indent=2, sort_keys=True) + "\n"
    with atomic_write(d / CONFIG_NAME) as f:
        f.write(text.encode("utf-8"))
