"""RMSprop (Hinton's, as PyTorch implements it): alpha, eps, weight_decay, momentum, centered.

State per parameter, with PyTorch's keys: ``step``, ``square_avg``, ``momentum_buffer``
(momentum > 0) and ``grad_avg`` (centered).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .. import ops
from ._optimizer import Optimizer, check_lr

__all__ = ["RMSprop"]


class RMSprop(Optimizer):
    """p -= lr * g / (sqrt(E[g^2] (- E[g]^2 when centered)) + eps), with optional momentum and L2 weight decay."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        *,
        maximize: bool = False,
    ) -> None:
        super().__init__(
            params,
            {
                "lr": lr,
                "alpha": alpha,
                "eps": eps,
                "weight_decay": weight_decay,
                "momentum": momentum,
                "centered": bool(centered),
                "maximize": bool(maximize),
            },
        )

    def _check_group(self, group: dict[str, Any]) -> None:
        super()._check_group(group)
        check_lr("alpha", group["alpha"])
        check_lr("eps", group["eps"])
        check_lr("weight_decay", group["weight_decay"])
        check_lr("momentum", group["momentum"])

    def _update(self, group: dict[str, Any]) -> None:
        lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
        wd, momentum, centered = group["weight_decay"], group["momentum"], group["centered"]
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            if group["maximize"]:
                g = -g
            if wd:
                g = g + p * wd
            state = self.state.get(p)
            if state is None:
                state = self.state[p] = {"step": 0, "square_avg": ops.zeros_like(p)}
            if momentum > 0 and "momentum_buffer" not in state:
                state["momentum_buffer"] = ops.zeros_like(p)
            if centered and "grad_avg" not in state:
                state["grad_avg"] = ops.zeros_like(p)
            state["step"] += 1
            sq = state["square_avg"]
            sq.mul_(alpha).add_(g * g, alpha=1.0 - alpha)
            if centered:
                ga = state["grad_avg"]
                ga.mul_(alpha).add_(g, alpha=1.0 - alpha)
                avg = (sq - ga * ga).sqrt().add_(eps)
            else:
                avg = sq.sqrt().add_(eps)
            if momentum > 0:
                buf = state["momentum_buffer"]
                buf.mul_(momentum).add_(g / avg)
                p.add_(buf, alpha=-lr)
            else:
                p.add_(g / avg, alpha=-lr)
