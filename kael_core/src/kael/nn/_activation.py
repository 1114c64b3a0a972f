"""Activation modules with PyTorch's names, arguments, defaults and reprs (``kael.nn.ReLU`` ... ``PReLU``).

Each forwards to its ``kael.nn.functional`` form; only ``PReLU`` has a parameter
(``weight``, PyTorch's state_dict key).
"""

from __future__ import annotations

from typing import Any

from .. import _dtype as dt
from .._errors import DTypeError, ShapeError
from .._tensor import Tensor
from ..ops import empty
from . import functional as F
from . import init
from ._module import Module
from ._parameter import Parameter

__all__ = [
    "ReLU",
    "ReLU6",
    "GELU",
    "SiLU",
    "Tanh",
    "Sigmoid",
    "Softmax",
    "LogSoftmax",
    "LeakyReLU",
    "ELU",
    "Softplus",
    "Mish",
    "Hardswish",
    "Hardsigmoid",
    "Hardtanh",
    "Softsign",
    "LogSigmoid",
    "PReLU",
]


def _inplace_repr(inplace: bool) -> str:
    return "inplace=True" if inplace else ""


class ReLU(Module):
    """ReLU(x) = max(x, 0), elementwise."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = bool(inplace)

    def forward(self, x: Tensor) -> Tensor:
        """max(x, 0), elementwise."""
        return F.relu(x, self.inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace)


class GELU(Module):
    """GELU(x) = x * Phi(x); approximate='tanh' is GPT-2's ``gelu_new``."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise DTypeError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        """GELU of x (exact, or the tanh approximation this layer was made with)."""
        return F.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    """SiLU(x) = x * sigmoid(x) (swish; the activation of Llama-family MLPs). inplace overwrites the input."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = bool(inplace)

    def forward(self, x: Tensor) -> Tensor:
        """x * sigmoid(x), elementwise (in place with inplace=True)."""
        return F.silu(x, self.inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace)


class Tanh(Module):
    """Tanh(x), elementwise."""

    def forward(self, x: Tensor) -> Tensor:
        """tanh(x)."""
        return F.tanh(x)


class Sigmoid(Module):
    """Sigmoid(x) = 1 / (1 + exp(-x)), elementwise."""

    def forward(self, x: Tensor) -> Tensor:
        """sigmoid(x)."""
        return F.sigmoid(x)


class Softsign(Module):
    """Softsign(x) = x / (1 + |x|)."""

    def forward(self, x: Tensor) -> Tensor:
        """x / (1 + |x|)."""
        return F.softsign(x)


class LogSigmoid(Module):
    """LogSigmoid(x) = log(sigmoid(x)), computed stably."""

    def forward(self, x: Tensor) -> Tensor:
        """log(sigmoid(x))."""
        return F.logsigmoid(x)


class Softmax(Module):
    """Softmax along ``dim`` (None: PyTorch's legacy implicit dim)."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        """softmax(x) along this layer's dim."""
        return F.softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Module):
    """LogSoftmax along ``dim`` (None: PyTorch's legacy implicit dim)."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        """log_softmax(x) along this layer's dim."""
        return F.log_softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LeakyReLU(Module):
    """x where x > 0, else negative_slope * x."""

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, bool(inplace)

    def forward(self, x: Tensor) -> Tensor:
        """leaky_relu(x, negative_slope)."""
        return F.leaky_relu(x, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class ELU(Module):
    """x where x > 0, else alpha * (exp(x) - 1)."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha, self.inplace = alpha, bool(inplace)

    def forward(self, x: Tensor) -> Tensor:
        """elu(x, alpha)."""
        return F.elu(x, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class Softplus(Module):
    """log(1 + exp(beta * x)) / beta, linear above ``threshold`` (in units of beta * x)."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x: Tensor) -> Tensor:
        """softplus(x, beta, threshold)."""
        return F.softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class Mish(Module):
    """x * tanh(softplus(x))."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = bool(inplace)

    def forward(self, x: Tensor) -> Tensor:
        """mish(x)."""
        return F.mish(x, self.inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace)


class Hardswish(Module):
    """x * relu6(x + 3) / 6."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = bool(inplace)

    def forward(self, x: Tensor) -> Tensor:
        """hardswish(x)."""
        return F.hardswish(x, self.inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace)


class Hardsigmoid(Module):
    """relu6(x + 3) / 6."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = bool(inplace)

    def forward(self, x: Tensor) -> Tensor:
        """hardsigmoid(x)."""
        return F.hardsigmoid(x, self.inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace)


class Hardtanh(Module):
    """x clipped to [min_val, max_val]."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        if min_val > max_val:
            raise ShapeError(f"Hardtanh: min_val {min_val} must not be greater than max_val {max_val}")
        self.min_val, self.max_val, self.inplace = min_val, max_val, bool(inplace)

    def forward(self, x: Tensor) -> Tensor:
        """hardtanh(x, min_val, max_val)."""
        return F.hardtanh(x, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}" + (", inplace=True" if self.inplace else "")


class ReLU6(Hardtanh):
    """min(max(x, 0), 6): Hardtanh(0, 6)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace)


class PReLU(Module):
    """x where x > 0, else weight * x, with a learnt slope (one, or one per channel: num_parameters)."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if isinstance(num_parameters, bool) or not isinstance(num_parameters, int) or num_parameters < 1:
            raise ShapeError(f"PReLU: num_parameters must be a positive int, got {num_parameters!r}")
        d = dt.as_dtype(dtype) if dtype is not None else dt.get_default_dtype()
        if not d.is_floating_point:
            raise DTypeError(f"PReLU: parameters need a floating-point dtype, got {d!r}")
        self.num_parameters, self.init = num_parameters, float(init)
        self.weight = Parameter(empty(num_parameters, dtype=d, device=device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Fill the slopes with ``init`` (0.25 by default)."""
        init.constant_(self.weight, self.init)

    def forward(self, x: Tensor) -> Tensor:
        """prelu(x, weight)."""
        return F.prelu(x, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"
