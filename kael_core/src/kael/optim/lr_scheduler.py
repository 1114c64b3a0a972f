"""Learning-rate schedulers: LambdaLR, StepLR and cosine decay with linear warmup.

A scheduler sets ``group["lr"]`` of its optimizer's groups from each group's
``initial_lr``; call ``scheduler.step()`` once after each ``optimizer.step()``.
Construction applies the factor for step 0 (so a warmup starts from lr 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .._errors import DTypeError, KaelError
from ._optimizer import Optimizer

__all__ = ["LRScheduler", "LambdaLR", "StepLR", "CosineWithWarmupLR", "cosine_with_warmup"]


class LRScheduler:
    """The base of the learning-rate schedulers: each ``step()`` sets every param group's lr from ``get_lr()``."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise DTypeError(f"{type(self).__name__}: expected a kael.optim.Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        for i, g in enumerate(optimizer.param_groups):
            if last_epoch == -1:
                g.setdefault("initial_lr", g["lr"])
            elif "initial_lr" not in g:
                raise KaelError(
                    f"{type(self).__name__}: resuming at last_epoch={last_epoch} needs 'initial_lr' in "
                    f"parameter group {i}"
                )
        self.base_lrs: list[float] = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._last_lr: list[float] = []
        self.step()

    def get_lr(self) -> list[float]:
        """The learning rate of each group at step ``self.last_epoch``."""
        raise NotImplementedError

    def step(self) -> None:
        """Advance the schedule one step and set each param group's learning rate."""
        self.last_epoch += 1
        self._last_lr = self.get_lr()
        for g, lr in zip(self.optimizer.param_groups, self._last_lr):
            g["lr"] = lr

    def get_last_lr(self) -> list[float]:
        """The learning rates the last step set, one per param group."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state (everything but the optimizer and its functions), for load_state_dict."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer" and not callable(v) and k != "lr_lambdas"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state that state_dict returned."""
        self.__dict__.update(state_dict)


class LambdaLR(LRScheduler):
    """lr = initial_lr * lr_lambda(step), one function for all groups or one per group."""

    def __init__(
        self,
        optimizer: Optimizer,
        lr_lambda: Callable[[int], float] | list[Callable[[int], float]],
        last_epoch: int = -1,
    ) -> None:
        n = len(optimizer.param_groups)
        fns = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        if len(fns) != n:
            raise KaelError(f"LambdaLR: got {len(fns)} lr_lambdas for {n} parameter groups")
        self.lr_lambdas = fns
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * f(self.last_epoch) for base, f in zip(self.base_lrs, self.lr_lambdas)]


class StepLR(LRScheduler):
    """lr = initial_lr * gamma ** (step // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        if isinstance(step_size, bool) or not isinstance(step_size, int) or step_size < 1:
            raise DTypeError(f"StepLR: step_size must be a positive int, got {step_size!r}")
        self.step_size, self.gamma = step_size, float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


def cosine_with_warmup(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0) -> float:
    """The factor at `step`: linear from 0 to 1 over warmup_steps, then a half cosine down to min_lr_ratio
    at total_steps (and min_lr_ratio after it)."""
    if step < warmup_steps:
        return step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class CosineWithWarmupLR(LambdaLR):
    """Linear warmup over warmup_steps, then cosine decay to min_lr_ratio * initial_lr at total_steps."""

    def __init__(
        self, optimizer: Optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0, last_epoch: int = -1
    ) -> None:
        for name, v in (("warmup_steps", warmup_steps), ("total_steps", total_steps)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise DTypeError(f"CosineWithWarmupLR: {name} must be a non-negative int, got {v!r}")
        if warmup_steps > total_steps:
            raise DTypeError(f"CosineWithWarmupLR: warmup_steps ({warmup_steps}) exceeds total_steps ({total_steps})")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise DTypeError(f"CosineWithWarmupLR: min_lr_ratio must be in [0, 1], got {min_lr_ratio!r}")
        self.warmup_steps, self.total_steps, self.min_lr_ratio = warmup_steps, total_steps, float(min_lr_ratio)
        super().__init__(
            optimizer, lambda s: cosine_with_warmup(s, warmup_steps, total_steps, min_lr_ratio), last_epoch
        )
