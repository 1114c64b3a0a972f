"""The decode step over a KV cache that works for every family (``GenericStep``), and what the
families' direct steps share.

``GenericStep`` is the ``DecodeStep`` of a family without a fast one (or on a backend
that lacks the fused kernels a fast one calls): it runs the model's own pieces
(``embed``, ``run_layer``, ``run_head``) over one new token per row, with the cache's
``rows_step`` (a ``PagedStep``) as the cache step, which writes each row's keys and values
at its own position and attends each row to exactly its own keys (no padding, no length
mask: NOTE [batched = alone] in ``_batched.py``). ``decode_step`` picks the family's step
or this one.

``step_kernels``, ``Proj``, ``projection`` and ``weight_kernels`` are what a family's
direct step (GPT-2's, Llama's) uses to find its kernels and run each projection with
``linear`` or, for a weight in a weight format (``kael.quant.QuantizedLinear``,
``QuantizedTable``), ``quantized_linear``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from .. import _dispatch
from .. import _dtype as dt
from .._errors import KaelError, ShapeError
from .._tensor import Tensor
from ..ops import tensor, view
from ..ops._views import make_view

if TYPE_CHECKING:
    from ._paged_cache import PagedKVCache
    from ._protocol import CausalLM, DecodeStep

__all__ = [
    "WAVE_ROWS",
    "GenericStep",
    "Proj",
    "decode_step",
    "gather_rows",
    "in_waves",
    "projection",
    "step_kernels",
    "step_positions",
    "weight_kernels",
]

WAVE_ROWS = 16
"""Rows up to which the backends' few-row products round each row as alone (NOTE [batched = alone])."""


class GenericStep:
    """The decode step through the model's own modules (any family, any backend)."""

    def __init__(self, model: CausalLM, cache: PagedKVCache) -> None:
        self.model, self.cache = model, cache

    def __call__(self, rows: list[int], tokens: list[int]) -> Tensor:
        cache, model = self.cache, self.model
        starts = [cache.lengths[r] for r in rows]
        if max(starts) >= cache.max_positions:
            raise ShapeError(f"GenericStep: a row is past the cache's {cache.max_positions} positions (at {starts})")
        step = cache.rows_step(rows)
        ids = tensor([[t] for t in tokens], dtype=dt.int64, device=model.device)
        logits = model.run_head(_layers(model, model.embed(ids, step.starts), step))
        return view(logits, len(rows), model.vocab_size)


def step_positions(name: str, cache: PagedKVCache, rows: list[int], positions: list[int] | None = None) -> list[int]:
    """The positions of a direct decode step's entries: ``positions`` (NOTE [entries at positions]) or
    each row's cached length; a ShapeError naming step ``name`` when they do not fit.

    NOTE [entries at positions]: a direct step may take ``positions``: entry i feeds its token at
    ``positions[i]`` of row ``rows[i]``, and a row may appear several times, at consecutive positions
    from its cached length, each entry's slot granted beforehand (a KV manager's ``grow``). Every
    layer writes all entries' keys and values before any entry attends, and entry i attends to the
    keys up to its own position: exactly the causal attention of those tokens fed one step at a
    time, so a row's draft tokens verify in the step that decodes the other rows (kael.engine's
    speculation), with one pass of frontend calls instead of a pass per verifying row. Projections
    of more than ``WAVE_ROWS`` entries run in waves of that many rows (``in_waves``), so every
    entry's logits have the bits of the same token decoded alone.
    """
    if positions is None:
        pos = [cache.lengths[r] for r in rows]
    else:
        pos = [int(p) for p in positions]
        if len(pos) != len(rows):
            raise ShapeError(f"{name}: {len(rows)} rows but {len(pos)} positions")
    if len(rows) > cache.step_rows:
        raise ShapeError(f"{name}: {len(rows)} entries, but the step is built for {cache.step_rows} rows")
    if max(pos) >= cache.max_positions:
        raise ShapeError(f"{name}: a row is past the cache's {cache.max_positions} positions (at {pos})")
    return pos


def in_waves(project: Any, rows: int) -> Any:
    """``project(out, x, proj)`` over ``rows`` rows as calls of at most ``WAVE_ROWS`` rows each (the
    first dimension of ``out`` and ``x``), or ``project`` itself when one call is that small."""
    if rows <= WAVE_ROWS:
        return project

    def waves(out: Tensor, x: Tensor, p: Proj) -> None:
        for s in range(0, rows, WAVE_ROWS):
            m = min(WAVE_ROWS, rows - s)
            project(_first_rows(out, s, m), _first_rows(x, s, m), p)

    return waves


GATHER_FROM = 4
"""Rows from which ``gather_rows`` takes one ``embedding`` call (fewer: a copy per row is cheaper)."""


def gather_rows(out: Tensor, table: Tensor, ids: list[int]) -> bool:
    """``out`` [n, 1, D] := rows ``ids`` of ``table`` [V, D] in one ``embedding`` kernel call, when the step has
    at least ``GATHER_FROM`` rows and the backend has the kernel; False (nothing done) otherwise. A row copy
    moves the same bits, so the choice changes nothing but the step's count of kernel calls."""
    if len(ids) < GATHER_FROM:
        return False
    embedding = _dispatch.fused_kernel(out.device.type, "embedding")
    if embedding is None:
        return False
    embedding(out, table, tensor([[i] for i in ids], dtype=dt.int64, device=out.device))
    return True


def _first_rows(t: Tensor, start: int, n: int) -> Tensor:
    return make_view(t, (n, *t.shape[1:]), t._strides, t._offset + start * t._strides[0])


def _layers(model: CausalLM, x: Tensor, step: Any) -> Tensor:
    for i in range(model.num_layers):
        x = model.run_layer(i, x, step)
    return x


def decode_step(model: CausalLM, cache: PagedKVCache, direct: bool | None = None) -> DecodeStep:
    """The family's fast step over ``cache`` when it has one (``direct`` None or True), else ``GenericStep``.

    ``direct=True`` insists on the fast step (a KaelError if the family or backend has none);
    ``direct=False`` always takes the generic one.
    """
    fast = model.decode_step(cache) if direct is not False else None
    if direct and fast is None:
        raise KaelError(
            f"{type(model).__name__} has no fast decode step on the {model.device.type!r} backend "
            "(it lacks a fused kernel the step calls)"
        )
    return fast if fast is not None else GenericStep(model, cache)


class Proj(NamedTuple):
    """One projection as a direct step runs it: weight [out, in] (float, a view is fine) and bias,
    or, with a ``scheme``, the weight as ``quantized_linear`` takes it (uint8 blocks, bf16/f16)."""

    weight: Tensor
    bias: Tensor | None
    scheme: str | None


def projection(module: Any) -> Proj:
    """The ``Proj`` of a projection module: a ``QuantizedLinear`` (it has ``scheme``), one with
    ``as_linear()`` (GPT-2's Conv1D), or one with ``weight`` [out, in] and ``bias``."""
    scheme = getattr(module, "scheme", None)
    if scheme is not None:
        return Proj(module.weight, module.bias, scheme)
    as_linear = getattr(module, "as_linear", None)
    w, b = as_linear() if callable(as_linear) else (module.weight, module.bias)
    return Proj(w, b, None)


def weight_kernels(model: Any) -> tuple[str, ...]:
    """The fused ops a direct step needs for the model's weight formats: ``quantized_linear`` when a
    module holds a weight in one, and ``dequantize`` when a token table does (``QuantizedTable``)."""
    from ._weights import QuantizedTable, module_scheme

    formats = [m for m in model.modules() if module_scheme(m) is not None]
    if not formats:
        return ()
    tables = any(isinstance(m, QuantizedTable) for m in formats)
    return ("quantized_linear", "dequantize") if tables else ("quantized_linear",)


def step_kernels(device_type: str, fused: tuple[str, ...]) -> dict[str, Any] | None:
    """The kernels a family's direct decode step calls: its ``fused`` ops plus ``copy`` and ``add``,
    or None when the backend lacks one of the fused ops (the step then falls back to the generic one).

    With ``linear`` among them, ``project(out, x, proj)`` runs a ``Proj``: ``linear`` for a float
    weight, ``quantized_linear`` (which must then be among ``fused``) for a weight format.
    """
    found = {op: _dispatch.fused_kernel(device_type, op) for op in fused}
    if any(k is None for k in found.values()):
        return None
    kernels: dict[str, Any] = dict(found)
    kernels["copy"] = _dispatch.kernel(device_type, "copy")
    kernels["add"] = _dispatch.kernel(device_type, "add")
    if "linear" in kernels:
        linear: Any = kernels["linear"]
        quantized: Any = kernels.get("quantized_linear")

        def project(out: Tensor, x: Tensor, p: Proj) -> None:
            if p.scheme is None:
                linear(out, x, p.weight, p.bias)
            else:
                quantized(out, x, p.weight, p.bias, p.scheme)

        kernels["project"] = project
    return kernels
