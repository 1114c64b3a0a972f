"""``GPTConfig``: the shape of a GPT-2 (defaults: GPT-2 small, 124M parameters)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..._errors import ShapeError

__all__ = ["GPTConfig"]


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a GPT-2 (defaults: GPT-2 small, 124M parameters)."""

    vocab_size: int = 50257
    max_positions: int = 1024
    layers: int = 12
    heads: int = 12
    dimension: int = 768
    layer_norm_epsilon: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_positions", "layers", "heads", "dimension"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ShapeError(f"GPTConfig: {name} must be a positive int, got {v!r}")
        if self.dimension % self.heads:
            raise ShapeError(f"GPTConfig: dimension {self.dimension} is not divisible by heads {self.heads}")
        eps = self.layer_norm_epsilon
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ShapeError(f"GPTConfig: layer_norm_epsilon must be a number in (0, 1), got {eps!r}")

    @property
    def head_dim(self) -> int:
        """The size of one attention head, ``dimension // heads``."""
        return self.dimension // self.heads

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict of the constructor's keywords (``GPT(**config.as_dict())`` builds that shape)."""
        return asdict(self)
