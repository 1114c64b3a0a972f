"""SGD with momentum, dampening, Nesterov momentum, weight decay and maximize (PyTorch's update rule)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._errors import KaelError
from ._optimizer import Optimizer, check_lr

__all__ = ["SGD"]


class SGD(Optimizer):
    """p -= lr * d, with d = g + weight_decay * p, then with momentum:
    buf = momentum * buf + (1 - dampening) * d (buf = d at the first step) and
    d = buf, or d + momentum * buf with nesterov.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        maximize: bool = False,
    ) -> None:
        super().__init__(
            params,
            {
                "lr": lr,
                "momentum": momentum,
                "dampening": dampening,
                "weight_decay": weight_decay,
                "nesterov": nesterov,
                "maximize": maximize,
            },
        )

    def _check_group(self, group: dict[str, Any]) -> None:
        super()._check_group(group)
        check_lr("momentum", group["momentum"])
        check_lr("weight_decay", group["weight_decay"])
        check_lr("dampening", group["dampening"])
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise KaelError("SGD: Nesterov momentum requires momentum > 0 and dampening == 0")

    def _update(self, group: dict[str, Any]) -> None:
        lr, momentum, dampening = group["lr"], group["momentum"], group["dampening"]
        wd, nesterov, maximize = group["weight_decay"], group["nesterov"], group["maximize"]
        for p in group["params"]:
            d = p.grad
            if d is None:
                continue
            if maximize:
                d = -d
            if wd:
                d = d + p * wd
            if momentum:
                state = self.state.setdefault(p, {})
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = d.clone()
                else:
                    buf.mul_(momentum).add_(d, alpha=1 - dampening)
                d = d + buf * momentum if nesterov else buf
            p.add_(d, alpha=-lr)
