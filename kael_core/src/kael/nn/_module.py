"""Module: the base class of layers and models (parameters, buffers, sub-modules, state dicts).

Assigning a ``Parameter``, a ``Module`` or (for a name registered with
``register_buffer``) a Tensor as an attribute registers it, as in PyTorch; names
are dotted paths in ``named_parameters()`` and ``state_dict()``
(``"0.weight"``, ``"h.3.attn.c_attn.bias"``), so a checkpoint loads by key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, TypeVar

from .._errors import DTypeError, KaelError, ShapeError
from .._tensor import Tensor
from ..autograd._grad_mode import no_grad
from ._parameter import Parameter

__all__ = ["Module", "IncompatibleKeys"]

M = TypeVar("M", bound="Module")


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict`` did not match: keys it expected and did not get, keys it got and has no place for."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _set_data(t: Tensor, src: Tensor) -> None:
    """Make t view src's elements (t keeps its identity, like ``param.data = src``)."""
    t._storage, t.shape, t._strides, t._offset = src._storage, src.shape, src._strides, src._offset
    t.dtype, t.device, t._npv = src.dtype, src.device, None


class Module:
    """Subclass, create parameters and sub-modules in ``__init__``, and define ``forward``."""

    training: bool
    _parameters: dict[str, Parameter | None]
    _buffers: dict[str, Tensor | None]
    _non_persistent: set[str]
    _modules: dict[str, Module | None]

    def __init__(self) -> None:
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", {})

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The module's computation; subclasses define it, and calling the module runs it."""
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # -- registration ---------------------------------------------------------------------
    def _check_init(self) -> None:
        if "_parameters" not in self.__dict__:
            raise KaelError(
                f"{type(self).__name__}: call super().__init__() before assigning parameters, buffers or sub-modules"
            )

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        if isinstance(value, Parameter):
            self._check_init()
            self._forget(name)
            d["_parameters"][name] = value
        elif isinstance(value, Module):
            self._check_init()
            self._forget(name)
            d["_modules"][name] = value
        elif "_parameters" in d and name in d["_parameters"]:
            if value is not None:
                raise DTypeError(
                    f"{type(self).__name__}.{name}: cannot assign {type(value).__name__} to a "
                    "parameter (expected kael.nn.Parameter or None)"
                )
            d["_parameters"][name] = None
        elif "_buffers" in d and name in d["_buffers"]:
            if value is not None and not isinstance(value, Tensor):
                raise DTypeError(
                    f"{type(self).__name__}.{name}: cannot assign {type(value).__name__} to a "
                    "buffer (expected a Tensor or None)"
                )
            d["_buffers"][name] = value
        elif "_modules" in d and name in d["_modules"] and value is None:
            d["_modules"][name] = None
        else:
            object.__setattr__(self, name, value)

    def _forget(self, name: str) -> None:
        d = self.__dict__
        d.pop(name, None)
        for table in (d["_parameters"], d["_buffers"], d["_modules"]):
            table.pop(name, None)
        d["_non_persistent"].discard(name)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if name in d.get(table, {}):
                del d[table][name]
                d["_non_persistent"].discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))

    def _check_name(self, name: str, what: str) -> None:
        self._check_init()
        if not isinstance(name, str) or not name or "." in name:
            raise KaelError(f"{type(self).__name__}: {what} name must be a non-empty string without '.', got {name!r}")
        if name in self.__dict__ and not any(name in t for t in (self._parameters, self._buffers, self._modules)):
            raise KaelError(f"{type(self).__name__}: attribute {name!r} already exists")

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Register ``param`` (a Parameter, or None for a declared-but-absent one) under ``name``."""
        self._check_name(name, "parameter")
        if param is not None and not isinstance(param, Parameter):
            raise DTypeError(
                f"register_parameter: {name!r} must be a kael.nn.Parameter or None, got {type(param).__name__}"
            )
        self._forget(name)
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """A tensor that is state but not a parameter (saved in state_dict unless persistent=False)."""
        self._check_name(name, "buffer")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise DTypeError(f"register_buffer: {name!r} must be a Tensor or None, got {type(tensor).__name__}")
        self._forget(name)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        """Register a sub-module (or None) under ``name``; its parameters then belong to this module."""
        self._check_name(name, "module")
        if module is not None and not isinstance(module, Module):
            raise DTypeError(f"add_module: {name!r} must be a Module or None, got {type(module).__name__}")
        self._forget(name)
        self._modules[name] = module

    register_module = add_module

    # -- traversal ------------------------------------------------------------------------
    def named_modules(self, memo: set[int] | None = None, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """(qualified name, module) for this module and every sub-module, depth first, each once."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(memo, f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator[Module]:
        """This module and every sub-module, depth first, each once."""
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """(name, module) for each direct sub-module, each once."""
        seen: set[int] = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self) -> Iterator[Module]:
        """Each direct sub-module, once."""
        for _, m in self.named_children():
            yield m

    def _named_members(self, table: str, prefix: str, recurse: bool) -> Iterator[tuple[str, Any]]:
        seen: set[int] = set()
        mods = self.named_modules(prefix=prefix) if recurse else iter([(prefix, self)])
        for mp, m in mods:
            for name, t in getattr(m, table).items():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                yield (f"{mp}.{name}" if mp else name), t

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(dotted name, parameter) pairs; a parameter shared by two modules is listed once."""
        return self._named_members("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        """Every parameter of this module (and of its sub-modules with recurse=True), each once."""
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        """(qualified name, tensor) for every buffer of this module (and of its sub-modules with recurse=True)."""
        return self._named_members("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        """Every buffer of this module (and of its sub-modules with recurse=True), each once."""
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def apply(self: M, fn: Callable[[Module], None]) -> M:
        """Call fn on every sub-module (children first) and then on self."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # -- modes and conversion -------------------------------------------------------------
    def train(self: M, mode: bool = True) -> M:
        """Set training mode (``mode=True``) or evaluation mode on this module and every sub-module; returns self."""
        if not isinstance(mode, bool):
            raise DTypeError(f"train: mode must be a bool, got {mode!r}")
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self: M) -> M:
        """Evaluation mode (``train(False)``): dropout off; returns self."""
        return self.train(False)

    def requires_grad_(self: M, requires_grad: bool = True) -> M:
        """Set ``requires_grad`` on every parameter; returns self."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's gradient: to None (the default), or to zeros with set_to_none=False."""
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                with no_grad():
                    p.grad.zero_()

    def to(self: M, *args: Any, device: Any = None, dtype: Any = None) -> M:
        """Move parameters and buffers to a device and/or cast floating-point ones to dtype, in place.

        Parameters keep their identity (an optimizer built before ``to`` still holds them).
        """
        from .. import _dtype as dt

        for a in args:
            if isinstance(a, dt.DType):
                dtype = a
            else:
                device = a
        if dtype is not None and not dt.as_dtype(dtype).is_floating_point:
            raise DTypeError(f"Module.to: dtype must be a floating-point dtype, got {dtype!r}")

        def convert(t: Tensor) -> Tensor:
            want = dtype if t.dtype.is_floating_point else None
            return t.detach().to(device=device, dtype=want)  # type: ignore[no-any-return]

        with no_grad():
            for m in self.modules():
                for p in m._parameters.values():
                    if p is None:
                        continue
                    new = convert(p)
                    if new._storage is not p._storage or new.dtype is not p.dtype:
                        _set_data(p, new)
                    if p.grad is not None:
                        p.grad = convert(p.grad)
                for name, b in list(m._buffers.items()):
                    if b is not None:
                        new = convert(b)
                        if new._storage is not b._storage or new.dtype is not b.dtype:
                            m._buffers[name] = new
        return self

    def float(self: M) -> M:
        """Cast every floating-point parameter and buffer to float32; returns self."""
        from .. import _dtype as dt

        return self.to(dtype=dt.float32)

    def double(self: M) -> M:
        """Cast every floating-point parameter and buffer to float64; returns self."""
        from .. import _dtype as dt

        return self.to(dtype=dt.float64)

    def cpu(self: M) -> M:
        """Move every parameter and buffer to device ``cpu``; returns self."""
        return self.to(device="cpu")

    # -- state dicts ----------------------------------------------------------------------
    def _state_targets(self, prefix: str = "") -> dict[str, tuple[Module, str]]:
        """Every state_dict key -> (owning module, attribute name), in PyTorch's order: a module's own
        parameters, then its persistent buffers, then each child's. A module or tensor reachable by two
        paths (tied weights) has a key for each, as in PyTorch."""
        out: dict[str, tuple[Module, str]] = {}
        for name, p in self._parameters.items():
            if p is not None:
                out[prefix + name] = (self, name)
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent:
                out[prefix + name] = (self, name)
        for name, m in self._modules.items():
            if m is not None:
                out.update(m._state_targets(f"{prefix}{name}."))
        return out

    def state_dict(self, prefix: str = "", keep_vars: bool = False) -> dict[str, Tensor]:
        """Parameters and persistent buffers by dotted name, detached (sharing memory)."""
        out: dict[str, Tensor] = {}
        for key, (m, name) in self._state_targets(prefix).items():
            t = getattr(m, name)
            out[key] = t if keep_vars else t.detach()
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy values into parameters and buffers by key.

        strict: every key of the module must be present and no other key may be; shapes
        must match in every case. Errors name every offending key; nothing is written
        unless all checks pass. Values are cast to each target's dtype and device.
        """
        if not isinstance(state_dict, Mapping):
            raise DTypeError(
                f"load_state_dict: expected a mapping of names to tensors, got {type(state_dict).__name__}"
            )
        targets = self._state_targets()
        missing = [k for k in targets if k not in state_dict]
        unexpected = [k for k in state_dict if k not in targets]
        problems = []
        if strict and missing:
            problems.append("missing key(s): " + ", ".join(repr(k) for k in missing))
        if strict and unexpected:
            problems.append("unexpected key(s): " + ", ".join(repr(k) for k in unexpected))
        values: dict[str, Tensor] = {}
        bad_shapes = []
        for key, (m, name) in targets.items():
            if key not in state_dict:
                continue
            v = state_dict[key]
            if not isinstance(v, Tensor):
                from ..ops import tensor

                try:
                    v = tensor(v)
                except KaelError:
                    problems.append(f"value for {key!r} is a {type(v).__name__}, not a tensor")
                    continue
            cur = getattr(m, name)
            if tuple(v.shape) != cur.shape:
                bad_shapes.append(f"{key!r}: checkpoint {list(v.shape)} vs model {list(cur.shape)}")
            values[key] = v
        if bad_shapes:
            problems.append("size mismatch for " + "; ".join(bad_shapes))
        if problems:
            err = ShapeError if (bad_shapes and len(problems) == 1) else KaelError
            raise err(f"error(s) in loading state_dict for {type(self).__name__}: " + "; ".join(problems))
        with no_grad():
            for key, v in values.items():
                m, name = targets[key]
                getattr(m, name).copy_(v)
        return IncompatibleKeys(missing, unexpected)

    # -- repr -----------------------------------------------------------------------------
    def extra_repr(self) -> str:
        """The text inside the parentheses of this module's repr line (override in layers)."""
        return ""

    def __repr__(self) -> str:
        lines = [f"({name}): " + _indent(repr(m)) for name, m in self._modules.items()]
        extra = self.extra_repr()
        if not lines:
            return f"{type(self).__name__}({extra})"
        body = ([extra] if extra else []) + lines
        return f"{type(self).__name__}(\n  " + "\n  ".join(body) + "\n)"


def _indent(s: str) -> str:
    return s.replace("\n", "\n  ")
