"""Adagrad (Duchi et al., as PyTorch implements it): lr_decay, weight_decay, initial_accumulator_value, eps.

State per parameter, with PyTorch's keys: ``step`` and ``sum`` (the accumulated squared gradients).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .. import ops
from ._optimizer import Optimizer, check_lr

__all__ = ["Adagrad"]


class Adagrad(Optimizer):
    """p -= lr / (1 + (step - 1) * lr_decay) * g / (sqrt(sum of g^2) + eps), with optional L2 weight decay."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        *,
        maximize: bool = False,
    ) -> None:
        check_lr("initial_accumulator_value", initial_accumulator_value)
        super().__init__(
            params,
            {
                "lr": lr,
                "lr_decay": lr_decay,
                "weight_decay": weight_decay,
                "initial_accumulator_value": initial_accumulator_value,
                "eps": eps,
                "maximize": bool(maximize),
            },
        )
        for group in self.param_groups:  # PyTorch creates the state up front
            for p in group["params"]:
                self.state[p] = {"step": 0, "sum": ops.full_like(p, float(group["initial_accumulator_value"]))}

    def _check_group(self, group: dict[str, Any]) -> None:
        super()._check_group(group)
        check_lr("lr_decay", group["lr_decay"])
        check_lr("weight_decay", group["weight_decay"])
        check_lr("initial_accumulator_value", group["initial_accumulator_value"])
        check_lr("eps", group["eps"])

    def _update(self, group: dict[str, Any]) -> None:
        lr, lr_decay, wd, eps = group["lr"], group["lr_decay"], group["weight_decay"], group["eps"]
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
                state = self.state[p] = {"step": 0, "sum": ops.full_like(p, float(group["initial_accumulator_value"]))}
            state["step"] += 1
            clr = lr / (1 + (state["step"] - 1) * lr_decay)
            state["sum"].add_(g * g)
            p.add_(g / state["sum"].sqrt().add_(eps), alpha=-clr)
