"""llama.cpp's quantization mixes: the type ``llama-quantize`` gives each tensor of a file.

NOTE [quantization mixes]
=========================
A llama.cpp "file type" such as Q4_K_M is not one format: ``llama_tensor_get_type`` (in
``src/llama-quant.cpp``) picks each tensor's type from its name, its row length, its place
among the tensors of its kind and a few model facts. ``mix_types`` follows those rules for the
file types below, without an importance matrix and without user overrides (facts from
llama.cpp as vendored by llama-cpp-python 0.3.36):

* Which tensors are quantized at all (``tensor_allows_quantization``): 2-D (or 3-D) tensors
  whose name ends in ``weight``, except norms (``_norm.weight``), the expert router
  (``ffn_gate_inp``), learned position embeddings and token types, and a few small special
  tensors; the others keep their type (``None`` here).
* The output head (``output.weight``, or ``token_embd.weight`` when the file has no
  ``output.weight``, i.e. tied embeddings): Q8_0 when its rows are not a whole number of the
  file type's blocks (or the model is Falcon), else Q6_K, except Q8_0 files keep Q8_0.
* ``attn_v`` (and the fused ``attn_qkv``, ``attn_kv_b``), counted in file order as i of n:
  Q2_K -> Q4_K if n_head/n_head_kv >= 4 else Q3_K; Q3_K_M -> Q5_K for the first 2, else
  Q4_K; Q3_K_L -> Q5_K; IQ4_NL/IQ4_XS -> Q5_K if n_head/n_head_kv >= 4; Q4_K_M/Q5_K_M ->
  Q6_K where ``use_more_bits(i, n)``; Q4_K_S -> Q5_K for the first 4; 8 experts -> Q8_0.
* ``ffn_down`` of layer i of n: Q2_K -> Q3_K; Q3_K_M -> Q5_K if i < n/16, else Q4_K (Falcon:
  Q4_K only where use_more_bits); Q3_K_L -> Q5_K (Falcon Q4_K); Q4_K_M -> Q6_K where
  use_more_bits (Falcon: Q6_K if i < n/16, Q5_K where use_more_bits); IQ4_NL/IQ4_XS -> Q5_K
  if i < n/8; Q5_K_M -> Q6_K where use_more_bits; Q4_K_S -> Q5_K if i < n/8 (not Falcon).
* ``attn_output``: Q2_K -> Q3_K, Q3_K_M -> Q4_K, Q3_K_L -> Q5_K (Falcon: Q3_K_L -> Q4_K;
  8 experts: Q5_K for the 2- to 4-bit mixes); ``attn_k`` with 8 experts -> Q8_0.
* ``use_more_bits(i, n)`` = i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2 (integer division).
* Last, a row length that is not a whole number of the chosen type's blocks falls back
  (``tensor_type_fallback``): IQ4_XS -> IQ4_NL, Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1,
  Q6_K -> Q8_0, and to F16 when even that does not fit.

A format name that is not a file type (``bf16``, ``f16``, ``q3_k``, ``q4_k``, ``q5_k``) gives a
uniform plan: every quantizable tensor in that format, the output head as above (a float format
keeps its head in the format, as llama.cpp's F16/BF16 files do), then the same fallbacks.

Not modelled: importance matrices, ``--pure``, ``--output-tensor-type`` and friends, the 70B
model-type rule (attn_v Q3_K/Q4_K -> Q5_K on 70B models), the IQ1/IQ2/IQ3/TQ/MXFP4 mixes and
Q2_K_S (llama-quantize refuses those without an importance matrix, or kael has no such format).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from types import MappingProxyType

from ..._errors import DTypeError, ShapeError
from ._registry import WeightFormat

__all__ = ["MIXES", "fitting", "mix_base", "mix_types", "plan_base", "use_more_bits"]

MIXES = MappingProxyType(
    {
        "q4_0": "q4_0",
        "q4_1": "q4_1",
        "q5_0": "q5_0",
        "q5_1": "q5_1",
        "q8_0": "q8_0",
        "q2_k": "q2_k",
        "q3_k_s": "q3_k",
        "q3_k_m": "q3_k",
        "q3_k_l": "q3_k",
        "q4_k_s": "q4_k",
        "q4_k_m": "q4_k",
        "q5_k_s": "q5_k",
        "q5_k_m": "q5_k",
        "q6_k": "q6_k",
        "iq4_nl": "iq4_nl",
        "iq4_xs": "iq4_xs",
    }
)
"""Each llama.cpp file type kael can mix (``llama-quantize``'s name in lower case) -> its base format."""

_FALLBACK = {"iq4_xs": "iq4_nl", "q2_k": "q4_0", "q3_k": "q4_0", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}
_KEEP_PARTS = (
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "attn_rel_b.weight",
    ".position_embd",
    ".rel_pos",
    ".patch_embd",
    "time_mix_",
)
_KEEP_NAMES = ("position_embd.weight", "token_types.weight")
_LAYER = re.compile(r"blk\.(\d+)\.")


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers that get more bits: the first and last eighth, and every third between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def mix_base(mix: str) -> str:
    """The base format of file type `mix` (``"q4_k_m"`` -> ``"q4_k"``); a DTypeError naming the known mixes."""
    base = MIXES.get(mix) if isinstance(mix, str) else None
    if base is None:
        raise DTypeError(f"unknown quantization mix {mix!r}; expected one of {', '.join(MIXES)}")
    return base


def plan_base(name: str) -> str:
    """The base format of a plan named `name`: a file type's (``"q4_k_m"`` -> ``"q4_k"``) or the format
    itself (``"q4_k"``, ``"bf16"``); a DTypeError naming the choices for anything else (f32 included)."""
    if isinstance(name, str) and name in MIXES:
        return MIXES[name]
    from . import FORMATS  # the registry imports this module's names; resolve at call time

    if not isinstance(name, str) or name not in FORMATS or name == "f32":
        choices = sorted({*MIXES, *(n for n in FORMATS if n != "f32")})
        raise DTypeError(f"unknown quantization mix or format {name!r}; expected one of {', '.join(choices)}")
    return name


def fitting(fmt: str, row: int) -> str | None:
    """`fmt`, or the format llama.cpp falls back to (``tensor_type_fallback``: q4_k -> q5_0, ...) when
    rows of `row` values are not a whole number of its blocks; None when neither fits."""
    for name in (fmt, _FALLBACK.get(fmt)):
        if name is not None and row % _block(name) == 0:
            return name
    return None


def _block(name: str) -> int:
    from . import get_format  # the registry imports this module's names; resolve at call time

    fmt: WeightFormat = get_format(name)
    return fmt.block_values


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part in ("attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight", "attn_k.weight", "attn_q.weight"):
        if part in name:
            return "attn_v" if part in ("attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight") else part[:6]
    if "attn_output.weight" in name:
        return "attn_output"
    for part in ("ffn_up", "ffn_gate", "ffn_down"):
        if part in name:
            return part
    return "other"


def _quantized(name: str, shape: Sequence[int]) -> bool:
    if len(shape) < 2 or not name.endswith("weight") or name in _KEEP_NAMES:
        return False
    return not any(part in name for part in _KEEP_PARTS)


class _Mixer:
    """The per-file state of ``llama_tensor_get_type`` (counters of attn_v and ffn_down tensors)."""

    def __init__(self, mix: str, n_wv: int, n_layer: int, gqa: int, n_expert: int, arch: str, tied: bool) -> None:
        self.mix, self.base = mix, plan_base(mix)
        self.uniform = mix not in MIXES
        self.n_wv, self.n_layer, self.gqa, self.n_expert, self.arch, self.tied = (
            n_wv,
            n_layer,
            gqa,
            n_expert,
            arch,
            tied,
        )
        self.i_wv = self.i_down = 0

    def _layer(self, counter: int, name: str) -> int:
        if self.n_expert <= 1:
            return counter
        m = _LAYER.search(name)
        if m is None or not 0 <= int(m.group(1)) < self.n_layer:
            raise ShapeError(f"mix_types: cannot place tensor {name!r} in a layer of 0..{self.n_layer - 1}")
        return int(m.group(1))

    def _head(self, row: int) -> str:
        if _block(self.base) == 1:  # a float format: llama.cpp's F16/BF16 files keep the head in it
            return self.base
        if self.arch == "falcon" or row % _block(self.base):
            return "q8_0"
        return "q6_k" if self.base != "q8_0" else "q8_0"

    def _attn_v(self) -> str | None:
        mix, i, gqa = self.mix, self.i_wv, self.gqa
        new: str | None = None
        if mix == "q2_k":
            new = "q4_k" if gqa >= 4 else "q3_k"
        elif mix == "q3_k_m":
            new = "q5_k" if i < 2 else "q4_k"
        elif mix == "q3_k_l":
            new = "q5_k"
        elif mix in ("iq4_nl", "iq4_xs") and gqa >= 4:
            new = "q5_k"
        elif mix in ("q4_k_m", "q5_k_m") and use_more_bits(i, self.n_wv):
            new = "q6_k"
        elif mix == "q4_k_s" and i < 4:
            new = "q5_k"
        if self.n_expert == 8:
            new = "q8_0"
        self.i_wv += 1
        return new

    def _ffn_down(self, name: str) -> str | None:
        mix, n, falcon = self.mix, self.n_layer, self.arch == "falcon"
        i = self._layer(self.i_down, name)
        self.i_down += 1
        more = use_more_bits(i, n)
        if mix == "q2_k":
            return "q3_k"
        if mix == "q3_k_m":
            return "q5_k" if i < n // 16 else "q4_k" if not falcon or more else "q3_k"
        if mix == "q3_k_l":
            return "q4_k" if falcon else "q5_k"
        if mix == "q4_k_m":
            if falcon:
                return "q6_k" if i < n // 16 else "q5_k" if more else "q4_k"
            return "q6_k" if more else None
        if i < n // 8 and mix in ("iq4_nl", "iq4_xs"):
            return "q5_k"
        if mix == "q5_k_m" and more:
            return "q6_k"
        if mix == "q4_k_s" and not falcon and i < n // 8:
            return "q5_k"
        return None

    def _attn_output(self) -> str | None:
        mix = self.mix
        if self.arch == "falcon":
            return "q4_k" if mix == "q3_k_l" else None
        if self.n_expert == 8:
            eight = ("q2_k", "q3_k_s", "q3_k_m", "iq4_nl", "q4_k_s", "q4_k_m", "iq4_xs")
            return "q5_k" if mix in eight else None
        return {"q2_k": "q3_k", "q3_k_m": "q4_k", "q3_k_l": "q5_k"}.get(mix)

    def pick(self, name: str, row: int) -> str:
        cat = _category(name)
        new: str | None = None
        if cat == "output" or (self.tied and cat == "token_embd"):
            new = self._head(row)
        elif cat == "token_embd" or self.uniform:
            new = None
        elif cat == "attn_v":
            new = self._attn_v()
        elif cat == "attn_k":
            new = "q8_0" if self.n_expert == 8 else None
        elif cat == "ffn_down":
            new = self._ffn_down(name)
        elif cat == "attn_output":
            new = self._attn_output()
        return fitting(new or self.base, row) or "f16"  # tensor_type_fallback


def mix_types(
    mix: str,
    tensors: Iterable[tuple[str, Sequence[int]]],
    *,
    n_head: int = 1,
    n_head_kv: int | None = None,
    n_layer: int | None = None,
    n_expert: int = 0,
    arch: str = "llama",
) -> dict[str, str | None]:
    """The format ``llama-quantize`` gives each tensor of a file quantized to `mix` (NOTE [quantization mixes]).

    Args:
        mix: a llama.cpp file type in lower case, one of ``MIXES`` (``"q4_k_m"``), or a format
            name for a uniform plan (``"q4_k"``, ``"bf16"``; see the NOTE).
        tensors: the file's (GGUF name, NumPy shape) pairs in file order (the shape's last
            dimension is the row length, GGUF's ne[0]); the order matters for the attn_v and
            ffn_down counters.
        n_head, n_head_kv: attention heads and key/value heads (their ratio is the GQA factor).
        n_layer: the number of blocks; by default one more than the largest ``blk.N.`` index.
        n_expert: experts per MoE layer (0 or 1 for a dense model).
        arch: the GGUF architecture name (``"falcon"`` has its own rules).

    Returns:
        name -> scheme (``"q6_k"``, ``"q4_k"``, ``"f16"``, ...) for each tensor that gets
        quantized, or ``None`` for a tensor kept as it is (norms, biases, 1-D tensors, ...).
    """
    listed = [(str(name), tuple(int(s) for s in shape)) for name, shape in tensors]
    for name, shape in listed:
        if any(s < 0 for s in shape):
            raise ShapeError(f"mix_types: tensor {name!r} has a negative dimension in {list(shape)}")
    if n_layer is None:
        layers = [int(m.group(1)) for name, _ in listed if (m := _LAYER.search(name))]
        n_layer = max(layers) + 1 if layers else 0
    kv = n_head if n_head_kv is None else n_head_kv
    if n_head < 1 or kv < 0 or n_layer < 0 or n_expert < 0:
        raise ShapeError(
            f"mix_types: expected n_head >= 1, n_head_kv >= 0, n_layer >= 0, n_expert >= 0; "
            f"got {n_head}, {kv}, {n_layer}, {n_expert}"
        )
    names = [name for name, _ in listed]
    n_wv = sum(_category(name) == "attn_v" for name in names)
    mixer = _Mixer(mix, n_wv, n_layer, n_head // kv if kv else 0, n_expert, arch, "output.weight" not in names)
    out: dict[str, str | None] = {}
    for name, shape in listed:
        out[name] = mixer.pick(name, shape[-1]) if _quantized(name, shape) else None
    return out
