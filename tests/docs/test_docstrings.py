"""Every public function, class and method of the documented modules has a docstring.

The API reference (docs/reference/, mkdocstrings with ``show_if_no_docstring: false``) shows
only what has a docstring, so a public name that loses its docstring silently drops out of
the docs: this test fails naming it. "Public" is a module's ``__all__``, and for a class the
methods and properties defined in its body whose names do not start with ``_``; a method
that overrides a documented base-class method shares its docstring (the base documents the
contract), as ``inspect.getdoc`` does.

NOTE [docstring gaps]: ``docstring_gaps.txt`` beside this file lists, one per line, public
names known to lack a docstring in files that were being edited when this test was written.
They are tolerated until documented; a listed name that has a docstring now fails the test
too (delete its line), so the list only shrinks.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import re
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
GAPS_FILE = Path(__file__).with_name("docstring_gaps.txt")

#: The modules the API reference documents (one ``::: module`` each under docs/reference/).
MODULES = (
    "kael",
    "kael.nn",
    "kael.nn.functional",
    "kael.nn.init",
    "kael.nn.utils",
    "kael.optim",
    "kael.optim.lr_scheduler",
    "kael.io",
    "kael.models",
    "kael.engine",
    "kael.backends",
    "kael.backends.catalogue",
    "kael.backends.dtypes",
    "kael.backends.host",
    "kael.backends.memory",
    "kael.backends.dispatch",
    "kael.testing",
    "kael_debug",
    "kael_server",
    "kael.cpu",
    "kael.cuda",
    "kael_backend_cpu",
    "kael_backend_cuda",
)

#: Packages whose objects are kael's to document (a name re-exported from elsewhere is not).
OWN = ("kael", "kael_debug", "kael_server", "kael_backend_cpu", "kael_backend_cuda")


def _own(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module.split(".")[0] in OWN


def _has_own_class_doc(cls: type) -> bool:
    doc = cls.__dict__.get("__doc__")
    if not doc or not doc.strip():
        return False
    generated = (dataclasses.is_dataclass(cls) or issubclass(cls, tuple)) and doc.startswith(f"{cls.__name__}(")
    return not generated and not (issubclass(cls, enum.Enum) and doc == "An enumeration.")


def _method_doc(cls: type, name: str, member: Any) -> str | None:
    """The docstring of ``cls.name``: its own, else the one of the base-class member it overrides."""
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    doc = getattr(member, "__doc__", None)
    if doc and doc.strip():
        return str(doc)
    for base in cls.__mro__[1:]:
        inherited = base.__dict__.get(name)
        if inherited is not None:
            return _method_doc(base, name, inherited)
    return None


def _is_method(member: Any) -> bool:
    return isinstance(member, (types.FunctionType, staticmethod, classmethod, property)) or (
        type(member).__name__ == "cached_property"
    )


def missing_docstrings(module: types.ModuleType) -> Iterator[str]:
    """Public names of ``module`` (by ``__all__``) without a docstring: functions, classes, their methods.

    Each is yielded as ``module.name`` or ``module.Class.method``.
    """
    names: Iterable[str] = getattr(module, "__all__", ())
    for name in names:
        obj = getattr(module, name)
        path = f"{module.__name__}.{name}"
        if inspect.isclass(obj) and _own(obj):
            if not _has_own_class_doc(obj):
                yield path
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not _is_method(member):
                    continue
                if not _method_doc(obj, attr, member):
                    yield f"{path}.{attr}"
        elif inspect.isroutine(obj) and _own(obj) and not (obj.__doc__ or "").strip():
            yield path


def _gaps() -> set[str]:
    lines = GAPS_FILE.read_text(encoding="utf-8").splitlines() if GAPS_FILE.exists() else []
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


@pytest.mark.parametrize("name", MODULES)
def test_public_names_have_docstrings(name: str) -> None:
    module = importlib.import_module(name)
    assert (module.__doc__ or "").strip(), f"{name} has no module docstring"
    missing = set(missing_docstrings(module))
    gaps = {g for g in _gaps() if _owner(g) == name}
    new = sorted(missing - gaps)
    assert not new, f"public names of {name} without a docstring (add one): {new}"
    fixed = sorted(gaps - missing)
    assert not fixed, f"{GAPS_FILE.name} lists names that are documented now (delete their lines): {fixed}"


def _owner(path: str) -> str:
    """The module of MODULES that a gap's dotted path belongs to (the longest prefix)."""
    return max((m for m in MODULES if path.startswith(m + ".")), key=len, default="")


def test_gap_list_names_only_documented_modules() -> None:
    for gap in _gaps():
        assert any(gap.startswith(m + ".") for m in MODULES), f"{GAPS_FILE.name}: {gap!r} is in no module of MODULES"


def test_every_documented_module_has_a_reference_page() -> None:
    pages = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs" / "reference").glob("*.md"))
    documented = set(re.findall(r"^::: ([\w.]+)\s*$", pages, flags=re.M))
    assert documented == set(MODULES)


def _fake_module() -> types.ModuleType:
    """A module written here: one documented and one undocumented name of each kind."""
    module = types.ModuleType("kael._fake_docs", "A fake module for the checker's own test.")
    source = '''
import dataclasses

def good():
    """Documented."""

def bad():
    pass

class Good:
    """Documented."""
    def method(self):
        """Documented."""
    @property
    def prop(self):
        """Documented."""
    def _private(self):
        pass

class Bad:
    def method(self):
        pass
    @property
    def prop(self):
        return 1
    @staticmethod
    def static():
        pass

class Child(Good):
    """Overrides documented methods without repeating their docstrings."""
    def method(self):
        pass

@dataclasses.dataclass
class Record:
    x: int

__all__ = ["good", "bad", "Good", "Bad", "Child", "Record"]
'''
    exec(compile(source, "<fake>", "exec", dont_inherit=True), module.__dict__)
    for value in module.__dict__.values():
        if inspect.isclass(value) or inspect.isfunction(value):
            value.__module__ = module.__name__
    return module


def test_checker_names_each_missing_docstring() -> None:
    found = sorted(missing_docstrings(_fake_module()))
    prefix = "kael._fake_docs."
    assert found == [prefix + n for n in ("Bad", "Bad.method", "Bad.prop", "Bad.static", "Record", "bad")]


def test_checker_fails_when_a_public_function_loses_its_docstring(monkeypatch: pytest.MonkeyPatch) -> None:
    import kael.nn.functional as F

    assert "kael.nn.functional.linear" not in set(missing_docstrings(F))
    monkeypatch.setattr(F.linear, "__doc__", None)
    assert "kael.nn.functional.linear" in set(missing_docstrings(F))
