"""Containers: Sequential, ModuleList and ModuleDict (sub-modules named "0", "1", ... or by key)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .._errors import DTypeError, IndexError_
from ._module import Module

__all__ = ["Sequential", "ModuleList", "ModuleDict"]


def _index(i: int, n: int, op: str) -> int:
    if isinstance(i, bool) or not isinstance(i, int):
        raise DTypeError(f"{op}: index must be an int or a slice, got {i!r}")
    if not -n <= i < n:
        raise IndexError_(f"{op}: index {i} is out of range for {n} modules")
    return i % n


class ModuleList(Module):
    """A list of modules, registered under "0", "1", ... (not callable: iterate over it in forward)."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _renumber(self, mods: list[Module]) -> None:
        self._modules.clear()
        for i, m in enumerate(mods):
            self.add_module(str(i), m)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(m for m in self._modules.values() if m is not None)

    def __getitem__(self, i: Any) -> Any:
        mods = list(self._modules.values())
        if isinstance(i, slice):
            return type(self)([m for m in mods[i] if m is not None])
        return mods[_index(i, len(mods), type(self).__name__)]

    def __setitem__(self, i: int, m: Module) -> None:
        self.add_module(str(_index(i, len(self), type(self).__name__)), m)

    def __delitem__(self, i: Any) -> None:
        mods = list(self._modules.values())
        if isinstance(i, slice):
            del mods[i]
        else:
            del mods[_index(i, len(mods), type(self).__name__)]
        self._renumber(mods)  # type: ignore[arg-type]

    def append(self, m: Module) -> ModuleList:
        """Add ``m`` at the end, named by its index; returns self."""
        self.add_module(str(len(self)), m)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        """Append each module of ``modules``; returns self."""
        for m in modules:
            self.append(m)
        return self

    def insert(self, index: int, m: Module) -> None:
        """Insert ``m`` before position ``index`` and renumber the modules after it."""
        mods = list(self._modules.values())
        mods.insert(index, m)
        self._renumber(mods)  # type: ignore[arg-type]


class Sequential(ModuleList):
    """Modules applied in order: Sequential(a, b, c)(x) == c(b(a(x)))."""

    def __init__(self, *modules: Module) -> None:
        super().__init__(modules)

    def forward(self, x: Any) -> Any:
        """Run the modules in order, each on the previous one's output."""
        for m in self._modules.values():
            if m is not None:
                x = m(x)
        return x

    def __getitem__(self, i: Any) -> Any:
        mods = list(self._modules.values())
        if isinstance(i, slice):
            return Sequential(*mods[i])  # type: ignore[arg-type]
        return mods[_index(i, len(mods), "Sequential")]


class ModuleDict(Module):
    """Modules by string key, in insertion order."""

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def __getitem__(self, key: str) -> Module:
        try:
            m = self._modules[key]
        except KeyError:
            raise IndexError_(f"ModuleDict: no module named {key!r}; keys: {list(self._modules)}") from None
        assert m is not None
        return m

    def __setitem__(self, key: str, m: Module) -> None:
        self.add_module(key, m)

    def __delitem__(self, key: str) -> None:
        self[key]
        del self._modules[key]

    def keys(self) -> Iterable[str]:
        """The names of the modules, in insertion order."""
        return self._modules.keys()

    def values(self) -> Iterable[Module]:
        """The modules, in insertion order."""
        return [m for m in self._modules.values() if m is not None]

    def items(self) -> Iterable[tuple[str, Module]]:
        """(name, module) pairs, in insertion order."""
        return [(k, m) for k, m in self._modules.items() if m is not None]

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        """Add (or replace) each (name, module) of a mapping or of an iterable of pairs."""
        pairs = modules.items() if isinstance(modules, Mapping) else modules
        for k, m in pairs:
            self.add_module(k, m)

    def pop(self, key: str) -> Module:
        """Remove the module named ``key`` and return it."""
        m = self[key]
        del self._modules[key]
        return m
