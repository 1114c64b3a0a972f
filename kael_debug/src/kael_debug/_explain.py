"""explain(t): a tensor's memory layout and autograd state, one field per line."""

from __future__ import annotations

import gc

from kael import Tensor

__all__ = ["explain"]


def _references(t: Tensor) -> int:
    """Live tensors sharing t's storage (temporaries already freed do not count)."""
    storage = t.untyped_storage()
    return sum(1 for r in gc.get_referrers(storage) if isinstance(r, Tensor) and r.untyped_storage() is storage)


def explain(t: Tensor) -> str:
    """A description of ``t``: shape, strides, offset, dtype, device, contiguity, storage, autograd state."""
    if not isinstance(t, Tensor):
        from kael import DTypeError

        raise DTypeError(f"explain: expected a kael.Tensor, got {type(t).__name__}")
    s = t.untyped_storage()
    lines = [
        f"shape: {list(t.shape)}",
        f"strides: {list(t.stride())}",
        f"offset: {t.storage_offset()}",
        f"dtype: {t.dtype.name}",
        f"device: {t.device}",
        f"contiguous: {'yes' if t.is_contiguous() else 'no'}",
        f"storage: {s.data_ptr():#x}, {s.nbytes} bytes, version {s.version}, references: {_references(t)}",
        f"requires_grad: {'yes' if t.requires_grad else 'no'}",
        f"leaf: {'yes' if t.is_leaf else 'no'}",
        f"has grad: {'yes' if t.grad is not None else 'no'}",
    ]
    if t.grad_fn is not None:
        lines.append(f"grad_fn: {t.grad_fn.name()}")
    return "\n".join(lines) + "\n"
