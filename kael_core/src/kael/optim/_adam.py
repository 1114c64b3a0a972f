"""Adam and AdamW, through the fused ``adamw_step`` op (a backend kernel, or its decomposition); AMSGrad in place.

Adam's weight decay is L2 regularisation (added to the gradient); AdamW's is
decoupled (the parameter shrinks by lr * weight_decay), which is what adamw_step
does. Adam is therefore adamw_step on grad + weight_decay * p with no decoupled decay.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from .. import ops
from .._errors import DTypeError
from ._optimizer import Optimizer, check_lr

__all__ = ["Adam", "AdamW"]


class _AdamBase(Optimizer):
    decoupled = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        maximize: bool,
        amsgrad: bool = False,
    ) -> None:
        super().__init__(
            params,
            {
                "lr": lr,
                "betas": betas,
                "eps": eps,
                "weight_decay": weight_decay,
                "amsgrad": bool(amsgrad),
                "maximize": maximize,
            },
        )

    def _check_group(self, group: dict[str, Any]) -> None:
        super()._check_group(group)
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise DTypeError(f"{type(self).__name__}: betas must be a pair of numbers, got {betas!r}")
        check_lr("beta1", betas[0], upper=1.0)
        check_lr("beta2", betas[1], upper=1.0)
        check_lr("eps", group["eps"])
        check_lr("weight_decay", group["weight_decay"])

    def _update(self, group: dict[str, Any]) -> None:
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        wd, maximize = group["weight_decay"], group["maximize"]
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            if maximize:
                g = -g
            if wd and not self.decoupled:
                g = g + p * wd
            state = self.state.get(p)
            if state is None:
                state = self.state[p] = {"step": 0, "exp_avg": ops.zeros_like(p), "exp_avg_sq": ops.zeros_like(p)}
            state["step"] += 1
            if group["amsgrad"]:
                self._amsgrad_step(p, g, state, lr, beta1, beta2, eps, wd)
                continue
            ops.adamw_step(
                p,
                g,
                state["exp_avg"],
                state["exp_avg_sq"],
                lr,
                beta1,
                beta2,
                eps,
                wd if self.decoupled else 0.0,
                state["step"],
            )

    def _amsgrad_step(
        self, p: Any, g: Any, state: dict[str, Any], lr: float, beta1: float, beta2: float, eps: float, wd: float
    ) -> None:
        """One AMSGrad update (PyTorch's): the denominator uses the running maximum of exp_avg_sq."""
        if self.decoupled and wd:
            p.mul_(1.0 - lr * wd)
        step = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(beta1).add_(g, alpha=1.0 - beta1)
        v.mul_(beta2).add_(g * g, alpha=1.0 - beta2)
        vmax = state.get("max_exp_avg_sq")
        if vmax is None:
            vmax = state["max_exp_avg_sq"] = ops.zeros_like(p)
        vmax.maximum_(v)
        denom = (vmax.sqrt() / math.sqrt(1.0 - beta2**step)).add_(eps)
        p.add_(m / denom, alpha=-lr / (1.0 - beta1**step))


class Adam(_AdamBase):
    """Adam (Kingma & Ba) with bias correction; weight_decay adds weight_decay * p to the gradient."""

    decoupled = False

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, maximize, amsgrad)


class AdamW(_AdamBase):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p *= 1 - lr * weight_decay each step."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, maximize, amsgrad)
