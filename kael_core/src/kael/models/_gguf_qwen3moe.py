"""GGUF's ``qwen3moe`` architecture (llama.cpp's ``MODEL_ARCH.QWEN3MOE``), read into ``Qwen3MoeForCausalLM``.

The file is a ``qwen3`` file (``_gguf_llama.py``: names, NEOX rope rows, q/k norms, metadata under
``qwen3moe.``) whose every layer's MLP is the mixture of experts, with shapes for E experts, F the
expert width, C hidden (row-major, as llama.cpp's converter stacks the per-expert matrices):

    blk.N.ffn_gate_inp.weight  [E, C]      model.layers.N.mlp.gate.weight (the router)
    blk.N.ffn_gate_exps.weight [E, F, C]   model.layers.N.mlp.experts.J.gate_proj.weight = [J]
    blk.N.ffn_up_exps.weight   [E, F, C]   ...experts.J.up_proj.weight
    blk.N.ffn_down_exps.weight [E, C, F]   ...experts.J.down_proj.weight

Metadata besides qwen3's: ``expert_count`` (E), ``expert_used_count`` (k), ``expert_feed_forward_length``
(F) and ``expert_weights_norm`` (renormalise the k weights; absent: true, as llama.cpp's qwen3moe graph
always renormalises). llama.cpp's qwen3moe has no dense layers, so ``decoder_sparse_step`` is 1 and
``mlp_only_layers`` empty. A float stack (F32, F16, BF16) loads as float32 expert weights (views of the
stack, then stacked as ``from_pretrained`` does); a stack in a weight format (``llama-quantize``'s Q8_0,
...) becomes one ``QuantizedLinear`` per expert over its [J] rows of blocks (``load_tensor``), the bytes
``kael.quantize`` gives the same checkpoint (``plan``: llama.cpp's per-tensor formats for this layout).
kael writes no qwen3moe file yet (``handles`` is false, ``save_gguf`` refuses it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .._errors import FormatError, KaelError
from ..autograd import no_grad
from ..nn._module import _set_data
from ..ops import empty, select
from . import _gguf_llama
from ._gguf import GGUF_SCHEMES, ROLE_LINEAR, ROLE_TABLE, TensorSpec, meta_int
from .llama import LlamaConfig
from .qwen3 import Qwen3Config
from .qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM, Qwen3MoeSparseMoeBlock

__all__ = [
    "ARCHITECTURES",
    "config_from_metadata",
    "tensor_specs",
    "export_specs",
    "new_model",
    "check_extra",
    "skip_tensor",
    "constant_tensor",
    "finish",
    "handles",
    "gguf_metadata",
    "load_tensor",
    "plan",
]

ARCHITECTURES = ("qwen3moe",)
_ARCH = "qwen3moe"
_DENSE = ("ffn_gate", "ffn_up", "ffn_down")
#: GGUF stack name -> (the block's load-time attribute, the expert projection it holds).
_STACKS = {"ffn_gate_exps": ("gate_exps", "gate_proj"), "ffn_up_exps": ("up_exps", "up_proj"),
           "ffn_down_exps": ("down_exps", "down_proj")}  # fmt: skip


def config_from_metadata(arch: str, metadata: Mapping[str, Any], tensors: Mapping[str, Any], where: str) -> Any:
    """The Qwen3MoeConfig of a ``qwen3moe`` file: qwen3's reading of the shared keys, and the expert keys."""
    prefix = f"{_ARCH}."
    shared = {("qwen3." + k[len(prefix) :] if k.startswith(prefix) else k): v for k, v in metadata.items()}
    base = _gguf_llama.config_from_metadata("qwen3", shared, tensors, where)
    e = meta_int(metadata, f"{prefix}expert_count", where)
    k = meta_int(metadata, f"{prefix}expert_used_count", where)
    f = meta_int(metadata, f"{prefix}expert_feed_forward_length", where)
    norm = metadata.get(f"{prefix}expert_weights_norm", True)
    if not isinstance(norm, bool):
        raise FormatError(f"{where}: metadata '{prefix}expert_weights_norm' must be a bool, got {norm!r}")
    if k > e:
        raise FormatError(f"{where}: metadata '{prefix}expert_used_count' {k} is more than expert_count {e}")
    values = {fl.name: getattr(base, fl.name) for fl in dataclasses.fields(LlamaConfig)}
    try:
        return Qwen3MoeConfig(
            **{**values, "model_type": "qwen3_moe"},
            num_experts=e,
            num_experts_per_tok=k,
            moe_intermediate_size=f,
            norm_topk_prob=norm,
        )
    except KaelError as exc:
        raise FormatError(f"{where}: the {_ARCH} metadata is not a valid model: {exc}") from None


def tensor_specs(config: Qwen3MoeConfig) -> list[TensorSpec]:
    """Every tensor of a ``qwen3moe`` file of ``config``: qwen3's less the dense MLP, and the experts'."""
    values = {fl.name: getattr(config, fl.name) for fl in dataclasses.fields(LlamaConfig)}
    qwen3 = Qwen3Config(**{**values, "model_type": "qwen3"})
    specs = [s for s in _gguf_llama.tensor_specs(qwen3) if s.name.split(".")[-2] not in _DENSE]
    c, f, e = config.hidden_size, config.moe_intermediate_size, config.num_experts
    for i in range(config.num_hidden_layers):
        b, m = f"blk.{i}.", f"model.layers.{i}.mlp."
        specs.append(TensorSpec(f"{b}ffn_gate_inp.weight", f"{m}gate.weight", (e, c)))
        for name, (attr, _) in _STACKS.items():
            shape = (e, c, f) if name == "ffn_down_exps" else (e, f, c)
            # ROLE_LINEAR: a weight format is allowed (load_tensor reads it; a float one lands in the placeholder)
            specs.append(TensorSpec(f"{b}{name}.weight", f"{m}{attr}", shape, ROLE_LINEAR))
    return specs


def export_specs(model: Any) -> list[TensorSpec]:
    raise KaelError("save_gguf: kael writes no qwen3moe GGUF file yet")


def gguf_metadata(model: Any) -> tuple[str, dict[str, Any]]:
    raise KaelError("save_gguf: kael writes no qwen3moe GGUF file yet")


def constant_tensor(model: Any, spec: TensorSpec) -> Any:
    return _gguf_llama.constant_tensor(model, spec)


def new_model(config: Qwen3MoeConfig, device: Any) -> Qwen3MoeForCausalLM:
    """The model, each sparse block holding empty load-time stacks the file's ``*_exps`` tensors replace."""
    model = Qwen3MoeForCausalLM(config, device=device, init=False)
    for block in _blocks(model):
        for attr, _ in _STACKS.values():
            setattr(block, attr, empty((0,), dtype=block.gate.weight.dtype, device=device))
    return model


def load_tensor(model: Qwen3MoeForCausalLM, spec: TensorSpec, t: Any, device: Any, mmap: bool) -> bool:
    """A quantized expert stack as one QuantizedLinear per expert (True); False for anything else (the loader's)."""
    name = spec.name.split(".")[-2]
    if name not in _STACKS or t.type not in GGUF_SCHEMES:
        return False
    from ..quant import QuantizedLinear
    from ._gguf import _stored, _weight_tensor

    scheme = GGUF_SCHEMES[t.type]
    block = model.model.layers[int(spec.name.split(".")[1])].mlp
    _, proj = _STACKS[name]
    data = _stored(t, None)
    _, out_f, in_f = spec.shape
    for j, expert in enumerate(block.experts):
        q = QuantizedLinear(
            in_f, out_f, scheme, bias=False, device=device, weight=_weight_tensor(data[j], scheme, device)
        )
        setattr(expert, proj, q)
    return True


def plan(config: Qwen3MoeConfig, weights: str) -> dict[str, str | None]:
    """Module name -> format (None: float) of a Qwen3-MoE model quantized to ``weights`` as ``llama-quantize``
    does its qwen3moe file (``mix_types`` over this layout; every expert of a stack takes the stack's format)."""
    from ..quant.formats import mix_types

    specs = tensor_specs(config)
    kinds = mix_types(
        weights,
        [(s.name, s.shape) for s in specs],
        n_head=config.num_attention_heads,
        n_head_kv=config.kv_heads,
        n_layer=config.num_hidden_layers,
        n_expert=config.num_experts,
        arch=_ARCH,
    )
    out: dict[str, str | None] = {}
    for s in specs:
        if s.name.split(".")[-2] in _STACKS:
            owner, proj = s.target.rsplit(".", 1)[0], _STACKS[s.name.split(".")[-2]][1]
            out.update({f"{owner}.experts.{j}.{proj}": kinds[s.name] for j in range(config.num_experts)})
        elif s.role in (ROLE_LINEAR, ROLE_TABLE):
            out[s.target.rsplit(".", 1)[0]] = kinds[s.name]
    return out


def check_extra(f: Any, where: str) -> None:
    """Nothing beyond the tensor specs."""


def skip_tensor(spec: TensorSpec) -> bool:
    return False


def finish(model: Qwen3MoeForCausalLM, mmap: bool) -> None:
    """Each expert's three weights become views of the loaded stacks, then a copy-mode load stacks them as
    ``from_pretrained`` does (NOTE [stacked experts]) and fuses q/k/v."""
    with no_grad():
        for block in _blocks(model):
            for attr, proj in _STACKS.values():
                stack = block.__dict__.pop(attr)
                if not stack.numel():  # loaded by load_tensor as quantized experts
                    continue
                for j, expert in enumerate(block.experts):
                    _set_data(getattr(expert, proj).weight, select(stack, 0, j))
    if not mmap and model.weights_scheme is None:
        from .llama._checkpoint import fuse_projections

        fuse_projections(model)


def handles(model: Any) -> bool:
    return False  # read only (module docstring)


def _blocks(model: Qwen3MoeForCausalLM) -> list[Qwen3MoeSparseMoeBlock]:
    return [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, Qwen3MoeSparseMoeBlock)]
