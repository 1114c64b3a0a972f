"""``kael.quantize(model, scheme)``: every projection of a model swapped for a QuantizedLinear, in place.

A projection is a ``kael.nn.Linear`` or any module defining ``as_linear() -> (weight
[out, in], bias | None)`` (GPT-2's ``Conv1D`` stores [in, out] and returns a transposed
view). Each is replaced in its parent by ``QuantizedLinear.from_float``, so a family's
forward must call its child modules (``self.c_attn(x)``) rather than read their weights.
A module reachable by two paths (tied) becomes one QuantizedLinear at both.
"""

from __future__ import annotations

from collections.abc import Iterable

from .._errors import DTypeError, ShapeError
from .._tensor import Tensor
from ..nn._layers import Linear
from ..nn._module import Module
from ..ops._quant import check_scheme
from ._formats import BLOCK_BYTES, BLOCK_VALUES, quantizable
from ._linear import QuantizedLinear

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

    ``scheme``: one of ``kael.quant.quantizable()`` (q8_0, q4_0, q4_1, q5_0, q5_1, bf16, f16; NOTE
    [weight formats]); the other formats of ``SCHEMES`` load and run but have no reference quantizer yet.
    ``skip``: qualified module names (``"lm_head"``, ``"h.0.attn.c_proj"``) left as they are,
    with everything under them. For the block schemes a projection whose in_features is not
    a multiple of 32 stays float32 (as llama.cpp keeps such tensors in a float type). With
    ``embeddings=True`` the model's ``quantize_embeddings(scheme)`` runs next, when it has
    one (a family quantizes its token table and tied LM head its own way). Then
    ``model.weights_scheme`` is set to `scheme` and ``model.on_quantized()`` runs when
    defined (a family rebuilds fused views or caches there).
    """
    check_scheme("quantize", scheme)
    if scheme not in quantizable():  # a format kael reads and runs but cannot write yet: never another one
        raise DTypeError(
            f"quantize: kael has no reference quantizer for {scheme!r} yet (files in it load and run); "
            f"expected one of {', '.join(quantizable())}"
        )
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
        if isinstance(m, QuantizedLinear) and m.scheme != scheme:
            raise DTypeError(
                f"quantize: {name!r} is already quantized to {m.scheme}; expected a float model to quantize to "
                f"{scheme} (quantizing a quantized weight again only adds error)"
            )
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
            if scheme in BLOCK_BYTES and w.shape[1] % BLOCK_VALUES[scheme]:
                done[id(child)] = child  # stays float32
                continue
            q = QuantizedLinear.from_float(w, b, scheme)
            done[id(child)] = q
            parent._modules[attr] = q  # in place: the state_dict keeps its key order

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
