"""Parameter: a Tensor that a Module registers as one of its learnable weights."""

from __future__ import annotations

from .._errors import DTypeError
from .._tensor import Tensor

__all__ = ["Parameter"]


class Parameter(Tensor):
    """A leaf tensor that requires grad by default and is found by ``Module.parameters()``.

    ``Parameter(t)`` shares ``t``'s storage (like ``torch.nn.Parameter``); ops on a
    parameter return plain Tensors.
    """

    __slots__ = ()

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = True) -> Parameter:
        if data is None:
            from ..ops import empty

            data = empty(0)
        if not isinstance(data, Tensor):
            raise DTypeError(f"Parameter: expected a kael Tensor, got {type(data).__name__}")
        p = cls._make(data._storage, data.shape, data._strides, data._offset, data.dtype)
        if requires_grad:
            p.requires_grad_(True)
        return p  # type: ignore[return-value]

    def __init__(self, data: Tensor | None = None, requires_grad: bool = True) -> None:
        pass  # everything happens in __new__ (Tensor.__init__ refuses direct construction)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()
