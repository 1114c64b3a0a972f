"""The Optimizer base class: parameter groups, per-parameter state, zero_grad and state dicts.

A subclass sets its hyper-parameter defaults and implements ``_update(group)``,
which runs with gradient recording off and changes parameters in place (their
identity never changes, so a Module and its optimizer keep sharing them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from .._errors import DTypeError, KaelError, ShapeError
from .._tensor import Tensor
from ..autograd._grad_mode import enable_grad, no_grad

__all__ = ["Optimizer", "check_lr"]


def check_lr(name: str, value: Any, *, upper: float | None = None) -> None:
    """A hyper-parameter must be a finite number >= 0 (and < upper when given)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (upper is not None and value >= upper)
    ):
        bound = f" and < {upper}" if upper is not None else ""
        raise DTypeError(f"invalid {name}: {value!r} (expected a finite number >= 0{bound})")


class Optimizer:
    """Holds ``param_groups`` (dicts with "params" and hyper-parameters) and ``state`` per parameter."""

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        self.defaults = dict(defaults)
        self.state: dict[Tensor, dict[str, Any]] = {}
        self.param_groups: list[dict[str, Any]] = []
        if isinstance(params, Tensor):
            raise DTypeError(
                f"{type(self).__name__}: params must be an iterable of tensors or of dicts, got a "
                "Tensor; pass model.parameters() or [tensor]"
            )
        groups = list(params)
        if not groups:
            raise KaelError(f"{type(self).__name__}: got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, group: dict[str, Any]) -> None:
        """Add a group of parameters (a dict with ``params`` and optional per-group settings such as ``lr``)."""
        if not isinstance(group, dict) or "params" not in group:
            raise DTypeError(f"add_param_group: expected a dict with a 'params' entry, got {group!r}")
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise DTypeError(f"{type(self).__name__}: parameter {i} is a {type(p).__name__}, not a Tensor")
            if not p.is_leaf:
                raise KaelError(
                    f"{type(self).__name__}: parameter {i} of shape {list(p.shape)} is not a leaf "
                    "tensor (it has a grad_fn); optimise leaves such as model parameters"
                )
            if not p.dtype.is_floating_point:
                raise DTypeError(f"{type(self).__name__}: parameter {i} has dtype {p.dtype!r}; expected floating")
            if id(p) in seen:
                raise KaelError(
                    f"{type(self).__name__}: parameter {i} of shape {list(p.shape)} appears in more "
                    "than one place; each parameter may be listed once"
                )
            seen.add(id(p))
        g = {k: v for k, v in group.items() if k != "params"}
        for k, v in self.defaults.items():
            g.setdefault(k, v)
        self._check_group(g)
        g["params"] = params
        self.param_groups.append(g)

    def _check_group(self, group: dict[str, Any]) -> None:
        """Validate a group's hyper-parameters (subclasses extend)."""
        check_lr("lr", group.get("lr"))

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every gradient (set_to_none=True, the default) or fill them with zeros."""
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    with no_grad():
                        p.grad.zero_()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient; closure re-evaluates the loss first."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            for group in self.param_groups:
                self._update(group)
        return loss

    def _update(self, group: dict[str, Any]) -> None:
        raise NotImplementedError

    # -- state dicts ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """{"state": {index: {name: value}}, "param_groups": [{hyper-parameters, "params": [index...]}]}.

        Parameters are numbered in group order, as in PyTorch, so the dict does not
        depend on tensor identities and loads into a fresh optimizer over the same model.
        """
        index: dict[int, int] = {}
        groups = []
        for g in self.param_groups:
            ids = []
            for p in g["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": ids})
        state = {index[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore hyper-parameters and state; tensors are copied to each parameter's device and dtype."""
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise DTypeError("load_state_dict: expected a dict with 'state' and 'param_groups' (from state_dict())")
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups):
            raise KaelError(
                f"load_state_dict: the state dict has {len(saved)} parameter groups, this optimizer "
                f"has {len(self.param_groups)}"
            )
        for i, (sg, g) in enumerate(zip(saved, self.param_groups)):
            if len(sg["params"]) != len(g["params"]):
                raise KaelError(
                    f"load_state_dict: group {i} has {len(sg['params'])} parameters in the state "
                    f"dict but {len(g['params'])} in this optimizer"
                )
        params = {i: p for sg, g in zip(saved, self.param_groups) for i, p in zip(sg["params"], g["params"])}
        new_state: dict[Tensor, dict[str, Any]] = {}
        for i, s in state_dict["state"].items():
            if i not in params:
                raise KaelError(f"load_state_dict: state for parameter index {i!r} that no group lists")
            p = params[i]
            entry = {}
            for k, v in s.items():
                if isinstance(v, Tensor):
                    if k != "step" and v.shape != p.shape:
                        raise ShapeError(
                            f"load_state_dict: state {k!r} of parameter {i} has shape "
                            f"{list(v.shape)}, the parameter has {list(p.shape)}"
                        )
                    v = v.detach().to(device=p.device, dtype=p.dtype if v.dtype.is_floating_point else None, copy=True)
                entry[k] = v
            new_state[p] = entry
        self.state = new_state
        for sg, g in zip(saved, self.param_groups):
            g.update({k: v for k, v in sg.items() if k != "params"})

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(g.items()) if k != "params"]
        return "\n".join(lines) + "\n)"
