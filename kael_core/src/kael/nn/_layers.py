"""Layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout, Dropout2d, Identity, Flatten and Unflatten.

Parameter shapes and initialisations follow PyTorch (``Linear.weight`` is
``[out_features, in_features]``), so checkpoints and results carry over.
"""

from __future__ import annotations

import math
from typing import Any

from .. import _dtype as dt
from .._errors import DTypeError, ShapeError
from .._tensor import Tensor
from ..ops import empty
from . import functional as F
from . import init
from ._module import Module
from ._parameter import Parameter

__all__ = ["Linear", "Embedding", "LayerNorm", "RMSNorm", "Dropout", "Dropout2d", "Identity", "Flatten", "Unflatten"]


def _positive(op: str, **sizes: Any) -> None:
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ShapeError(f"{op}: {name} must be a non-negative int, got {v!r}")


def _float_dtype(op: str, dtype: Any) -> dt.DType:
    d = dt.as_dtype(dtype) if dtype is not None else dt.get_default_dtype()
    if not d.is_floating_point:
        raise DTypeError(f"{op}: parameters need a floating-point dtype, got {d!r}")
    return d


class Linear(Module):
    """y = x @ weight.T + bias, weight [out_features, in_features] ~ U(-1/sqrt(in), 1/sqrt(in))."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__()
        _positive("Linear", in_features=in_features, out_features=out_features)
        d = _float_dtype("Linear", dtype)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(empty(out_features, in_features, dtype=d, device=device))
        self.register_parameter("bias", Parameter(empty(out_features, dtype=d, device=device)) if bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise as PyTorch does: weight and bias uniform in +-1/sqrt(in_features)."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # = U(-1/sqrt(in), 1/sqrt(in)), as in PyTorch
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features else 0.0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        """x [.., in_features] -> x @ weight.T + bias, [.., out_features]."""
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """A lookup table weight [num_embeddings, embedding_dim] ~ N(0, 1)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        _positive("Embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Parameter(
            empty(num_embeddings, embedding_dim, dtype=_float_dtype("Embedding", dtype), device=device)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise the table from N(0, 1), as PyTorch does."""
        init.normal_(self.weight)

    def forward(self, ids: Tensor) -> Tensor:
        """The rows of the table for integer ``ids`` of any shape: [*ids.shape, embedding_dim]."""
        return F.embedding(ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LayerNorm(Module):
    """Normalise over the last dimension, then scale by weight (ones) and shift by bias (zeros)."""

    def __init__(
        self,
        normalized_shape: Any,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if len(ns) != 1:
            raise ShapeError(f"LayerNorm: only normalisation over the last dimension is supported, got {list(ns)}")
        _positive("LayerNorm", normalized_shape=ns[0])
        d = _float_dtype("LayerNorm", dtype)
        self.normalized_shape, self.eps, self.elementwise_affine = ns, float(eps), elementwise_affine
        self.register_parameter("weight", Parameter(empty(ns, dtype=d, device=device)) if elementwise_affine else None)
        self.register_parameter(
            "bias", Parameter(empty(ns, dtype=d, device=device)) if elementwise_affine and bias else None
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Set weight to ones and bias to zeros (when the layer has them)."""
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        """Normalize x over its last ``normalized_shape`` dims, then scale by weight and add bias."""
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(Module):
    """Root-mean-square normalisation over the trailing normalized_shape dims, scaled by weight (ones).

    PyTorch's ``torch.nn.RMSNorm``: ``eps=None`` means the machine epsilon of the input's
    dtype at call time. Hugging Face's ``LlamaRMSNorm`` defaults to 1e-6 instead (and
    checkpoints give ``rms_norm_eps``): pass it explicitly. Values follow Hugging Face (see
    ``kael.nn.functional.rms_norm``).
    """

    def __init__(
        self,
        normalized_shape: Any,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, bool) or not isinstance(normalized_shape, (int, tuple, list)):
            raise ShapeError(
                f"RMSNorm: normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
            )
        ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if not ns:
            raise ShapeError("RMSNorm: normalized_shape must name at least one dimension, got []")
        for n in ns:
            _positive("RMSNorm", normalized_shape=n)
        if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0):
            raise DTypeError(f"RMSNorm: eps must be a non-negative number or None, got {eps!r}")
        d = _float_dtype("RMSNorm", dtype)
        self.normalized_shape = ns
        self.eps = None if eps is None else float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        self.register_parameter("weight", Parameter(empty(ns, dtype=d, device=device)) if elementwise_affine else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Set weight to ones (when the layer has one)."""
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        """x / sqrt(mean(x**2) + eps) over the last ``normalized_shape`` dims, times weight."""
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class Dropout(Module):
    """Zero each element with probability p in training (scaling the rest by 1/(1-p)); identity in eval."""

    def __init__(self, p: float = 0.5, generator: Any = None) -> None:
        super().__init__()
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
            raise DTypeError(f"Dropout: p must be a probability in [0, 1], got {p!r}")
        self.p = float(p)
        self.generator = generator

    def forward(self, x: Tensor) -> Tensor:
        """In training mode, zero each element with probability p and scale the rest by 1/(1-p); else x."""
        return F.dropout(x, self.p, self.training, generator=self.generator)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Dropout2d(Module):
    """Zero whole channels of [N, C, H, W] (or [C, H, W]) with probability p in training; identity in eval."""

    def __init__(self, p: float = 0.5, inplace: bool = False, generator: Any = None) -> None:
        super().__init__()
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
            raise DTypeError(f"Dropout2d: p must be a probability in [0, 1], got {p!r}")
        self.p, self.inplace, self.generator = float(p), bool(inplace), generator

    def forward(self, x: Tensor) -> Tensor:
        """x with channels dropped (training) or x (eval)."""
        return F.dropout2d(x, self.p, self.training, self.inplace, generator=self.generator)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Identity(Module):
    """A module that returns its input unchanged (a placeholder layer)."""

    def forward(self, x: Tensor) -> Tensor:
        """x itself."""
        return x


class Flatten(Module):
    """Flatten dims start_dim..end_dim (by default all but the batch dim)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        """x with dims start_dim..end_dim flattened into one (a view when x's strides allow)."""
        return x.flatten(self.start_dim, self.end_dim)  # type: ignore[no-any-return]

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Expand dim ``dim`` into ``unflattened_size`` (the inverse of Flatten)."""

    def __init__(self, dim: int, unflattened_size: Any) -> None:
        super().__init__()
        size = tuple(unflattened_size)
        if not size or any(isinstance(v, bool) or not isinstance(v, int) for v in size):
            raise ShapeError(
                f"Unflatten: unflattened_size must be a non-empty sequence of ints, got {unflattened_size!r}"
            )
        self.dim, self.unflattened_size = dim, size

    def forward(self, x: Tensor) -> Tensor:
        """x with dim replaced by unflattened_size (-1 allowed once)."""
        d = x._wrap_dim(self.dim, "Unflatten")
        return x.reshape(x.shape[:d] + self.unflattened_size + x.shape[d + 1 :])  # type: ignore[no-any-return]

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
