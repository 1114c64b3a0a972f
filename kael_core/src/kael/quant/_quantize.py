"""``kael.quantize(model, scheme)``: every projection of a model swapped for a QuantizedLinear, in place.

A projection is a ``kael.nn.Linear`` or any module defining ``as_linear() -> (weight
[out, in], bias | None)`` (GPT-2's ``Conv1D`` stores [in, out] and returns a transposed
view). Each is replaced in its parent by ``QuantizedLinear.from_float``, so a family's
forward must call its child modules (``self.c_attn(x)``) rather than read their weights.
A module reachable by two paths (tied) becomes one QuantizedLinear at both.
"""

from __future__ import annotations

from collections.abc import Iterable

from .. import cpu
from .._errors import DTypeError, ShapeError
from .._tensor import Tensor
from ..nn._layers import Linear
from ..nn._module import Module
from ._formats import quantizable
from ._linear import QuantizedLinear
from .formats import MIXES, fitting, plan_base

__all__ = ["quantize", "projection_of"]


def projection_of(m: Module) -> tuple[Tensor, Tensor | None] | None:
    """(weight [out, in], bias) of a projection module (``as_linear()`` or a Linear), None for any other module."""
    as_linear = getattr(m, "as_linear", None)
    if callable(as_linear):
        w, b = as_linear()
        return w, b
    if isinstance(m, Linear):
        return m.weight, m.bias
    return None


def quantize(model: Module, scheme: str, *, embeddings: bool = False, skip: Iterable[str] = ()) -> Module:
    """Quantize `model`'s projections to `scheme` in place and return the model.

    ``scheme``: a format of ``kael.quant.quantizable()`` (bf16, f16, q8_0, q4_0, q4_1, q5_0,
    q5_1, q2_k ... q6_k, iq4_nl, iq4_xs; NOTE [weights choice]) or a llama.cpp file type of
    ``kael.quant.formats.MIXES`` (``"q4_k_m"``, ``"q3_k_s"``, ...). A model with a
    ``quantization_plan(scheme)`` hook (the families kael exports to GGUF) gets the format
    ``llama-quantize`` gives each tensor (NOTE [quantization mixes]): module name -> format, or
    None to leave it float. Any other projection takes the scheme's base format, or the one
    llama.cpp falls back to when its blocks do not fit the row (q4_k -> q5_0, ...); a
    projection no block fits stays float32 (llama.cpp keeps it in a float type).
    ``skip``: qualified module names (``"lm_head"``, ``"h.0.attn.c_proj"``) left as they are,
    with everything under them. With ``embeddings=True`` the model's
    ``quantize_embeddings(scheme)`` runs next, when it has one (a family quantizes its token
    table and LM head its own way). Then ``model.weights_scheme`` is set to `scheme` and
    ``model.on_quantized()`` runs when defined (a family rebuilds fused views or caches there).
    """
    if not isinstance(scheme, str) or (scheme not in quantizable() and scheme not in MIXES):
        choices = [*quantizable(), *(m for m in MIXES if m not in quantizable())]
        raise DTypeError(f"quantize: unknown weight scheme {scheme!r}; expected one of {', '.join(choices)}")
    base = plan_base(scheme)
    if not isinstance(model, Module):
        raise DTypeError(f"quantize: expected a kael.nn.Module, got {type(model).__name__}")
    if isinstance(skip, str):
        raise DTypeError(f"quantize: skip must be a collection of module names, got the string {skip!r}")
    skipped = set(skip)
    bad = [s for s in skipped if not isinstance(s, str)]
    if bad:
        raise DTypeError(f"quantize: skip must hold module names (str), got {bad[0]!r}")
    if projection_of(model) is not None:
        raise ShapeError(
            f"quantize: the model itself is a projection ({type(model).__name__}); build a "
            "QuantizedLinear.from_float(weight, bias, scheme) instead (quantize swaps children in their parent)"
        )
    for name, m in model.named_modules():  # checked before anything changes
        if not isinstance(m, QuantizedLinear) or getattr(model, "weights_scheme", None) == scheme:
            continue  # a float module, or a model already in this scheme (a no-op)
        if m.scheme != scheme:
            raise DTypeError(
                f"quantize: {name!r} is already quantized to {m.scheme}; expected a float model to quantize to "
                f"{scheme} (quantizing a quantized weight again only adds error)"
            )
    hook = getattr(model, "quantization_plan", None)
    plan: dict[str, str | None] = dict(hook(scheme)) if callable(hook) else {}
    done: dict[int, Module] = {}  # id(original) -> its replacement (or itself when left float)

    def walk(parent: Module, prefix: str, stack: set[int]) -> None:
        for attr, child in list(parent._modules.items()):
            if child is None:
                continue
            name = f"{prefix}{attr}"
            if name in skipped:
                continue
            if id(child) in done:
                parent._modules[attr] = done[id(child)]
                continue
            proj = projection_of(child)
            if proj is None:
                if id(child) not in stack:
                    walk(child, name + ".", stack | {id(child)})
                continue
            w, b = proj
            fmt = plan[name] if name in plan else fitting(base, w.shape[1])
            if fmt is None:
                done[id(child)] = child  # stays float32
                continue
            q = QuantizedLinear.from_float(w, b, fmt)
            done[id(child)] = q
            parent._modules[attr] = q  # in place: the state_dict keeps its key order
            del w, b, proj, child
            # The float weight is free now (unless something else holds it): give it back before the next
            # projection's copies are made (cached, a whole model's float weights stayed until the end: 3x its size)
            cpu.empty_cache()

    walk(model, "", {id(model)})
    if embeddings:
        hook = getattr(model, "quantize_embeddings", None)
        if callable(hook):
            hook(scheme)
    setattr(model, "weights_scheme", scheme)  # noqa: B010  (Module has no declared attribute for it)
    after = getattr(model, "on_quantized", None)
    if callable(after):
        after()
    return model
