"""Writing a kael model as a GGUF file: ``save_gguf`` and ``python -m kael export-gguf`` (NOTE [gguf weights]).

Each family's ``export_specs`` lists the file's tensors (GGUF name, kael tensor, shape, role);
a quantized model's modules keep their bytes, and ``weights`` quantizes a float model's on the
way out tensor by tensor as ``llama-quantize`` would (``_weights_plan.gguf_plan``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _dtype as dt
from .._errors import KaelError
from .._tensor import Tensor
from ..autograd import no_grad
from ..nn import Module
from ..ops import detach, to

if TYPE_CHECKING:
    pass

from ._gguf import (
    _TYPE_OF,
    FILE_TYPES,
    ROLE_FLOAT,
    TensorSpec,
    _split,
    _submodule,
    architectures,
    rope_rows,
)
from ._weights_plan import gguf_family, gguf_plan

__all__ = ["save_gguf", "export_gguf_cli"]


def _host_float(t: Tensor) -> np.ndarray:
    return np.ascontiguousarray(to(detach(t), dtype=dt.float32)._host(), dtype=np.float32)


def _module_tensor(
    model: Module, spec: TensorSpec, scheme: str | None, inv: np.ndarray | None
) -> tuple[str, np.ndarray]:
    """(GGUF type, data) of one spec's tensor of ``model``; ``scheme`` quantizes a float projection/table."""
    from ..quant import QuantizedLinear, quantize_array
    from ._weights import QuantizedTable

    owner, attr = _split(spec.target)
    module = _submodule(model, owner)
    if spec.role != ROLE_FLOAT and isinstance(module, (QuantizedLinear, QuantizedTable)):
        w = module.weight if module.weight.device.type == "cpu" else to(module.weight, device="cpu")
        data = np.ascontiguousarray(w._np_view())  # uint8 blocks, float16, or bfloat16's uint16 bits
        if inv is not None:
            data = np.ascontiguousarray(data[inv])
        return _TYPE_OF[module.scheme], data
    arr = _host_float(getattr(module, attr))
    if spec.transpose:
        arr = np.ascontiguousarray(arr.T)
    if inv is not None:
        arr = np.ascontiguousarray(arr[inv])
    if spec.role == ROLE_FLOAT or scheme is None:
        return "F32", arr
    return _TYPE_OF[scheme], np.asarray(quantize_array(arr, scheme))


def save_gguf(model: Any, path: Any, tokenizer: Any = None, *, weights: Any = None) -> None:
    """Write ``model`` (a kael GPT-2 or Llama-family model) as a GGUF file llama.cpp loads.

    The metadata holds the architecture's hyperparameters and, given ``tokenizer`` (a
    ``BpeTokenizer`` or byte-level ``HFTokenizer``), the vocabulary
    (``kael.tokenizer.tokenizer_to_gguf``); without one the file says
    ``tokenizer.ggml.model = "none"``. Tensors as NOTE [gguf weights]: a quantized model's
    modules keep their bytes; ``weights`` quantizes a float model's on the way out (as
    ``from_pretrained(weights=...)`` would, NOTE [weights choice]), leaving the model as it
    is. Written atomically.
    """
    from ..io import write_gguf
    from ._weights import check_weights, is_quantized

    scheme = check_weights(weights, "save_gguf")
    fam = gguf_family(model)
    if fam is None:
        raise KaelError(
            f"save_gguf: expected a kael GPT or LlamaForCausalLM, got {type(model).__name__} "
            f"(GGUF export knows {sorted(architectures())})"
        )
    have = getattr(model, "weights_scheme", None)
    if scheme is not None and (have is not None or is_quantized(model)) and have != scheme:
        raise KaelError(
            f"save_gguf: the model holds {have or 'quantized'} weights; weights={weights!r} would requantize them "
            "(save the float model, or leave weights unset)"
        )
    if scheme is not None and model.dtype is not dt.float32:
        raise KaelError(f"save_gguf: weights={scheme!r} needs a float32 model, got {model.dtype!r}")
    arch, metadata = fam.gguf_metadata(model)
    effective = scheme if scheme is not None else have
    metadata = {
        "general.architecture": arch,
        "general.name": metadata.pop("general.name", arch),
        "general.file_type": FILE_TYPES.get(effective, 0),
        **metadata,
    }
    if tokenizer is not None:
        from ..tokenizer import tokenizer_to_gguf
        from ..tokenizer._gguf import TOKEN_UNUSED

        vocab = tokenizer_to_gguf(tokenizer)
        tokens, types = vocab["tokenizer.ggml.tokens"], vocab["tokenizer.ggml.token_type"]
        n = model.vocab_size
        if len(tokens) > n:
            raise KaelError(f"save_gguf: the tokenizer has {len(tokens)} tokens, more than the model's {n} embeddings")
        # A table with more rows than tokens (a padded vocabulary): unused tokens, as llama.cpp's converter adds.
        vocab["tokenizer.ggml.tokens"] = [*tokens, *(f"[PAD{i}]" for i in range(len(tokens), n))]
        vocab["tokenizer.ggml.token_type"] = [*types, *([TOKEN_UNUSED] * (n - len(types)))]
        metadata.update(vocab)
    else:
        metadata["tokenizer.ggml.model"] = "none"
    tensors: list[tuple[str, str, tuple[int, ...], np.ndarray]] = []
    plan = gguf_plan(model, scheme) if scheme is not None else {}
    with no_grad():
        for spec in fam.export_specs(model):
            if spec.constant:  # from the config (e.g. Llama's rope_freqs), float32 as llama.cpp reads it
                tensors.append((spec.name, "F32", spec.shape, fam.constant_tensor(model, spec)))
                continue
            inv = np.argsort(rope_rows(spec.shape[0], spec.rope_heads)) if spec.rope_heads else None
            kind, data = _module_tensor(model, spec, plan.get(spec.name), inv)
            tensors.append((spec.name, kind, spec.shape, data))
    write_gguf(path, metadata, tensors)


def export_gguf_cli(args: Any, out: Any = None, err: Any = None) -> int:
    """``python -m kael export-gguf MODEL OUT.gguf [--weights S]``: a checkpoint directory (any family
    ``save_gguf`` knows) and its tokenizer written as one GGUF file; 1 with the error on stderr."""
    import sys

    from ..tokenizer import load_tokenizer
    from ._registry import from_pretrained

    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        model = from_pretrained(args.model)
        tokenizer = load_tokenizer(args.model)
        save_gguf(model, args.out, tokenizer, weights=args.weights)
    except (KaelError, OSError) as exc:
        print(f"error: {exc}", file=err)
        return 1
    print(f"wrote {os.fspath(args.out)}", file=out)
    return 0
