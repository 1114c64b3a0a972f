"""scripts/docs_griffe.py: the griffe extensions that the API reference is built with."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
griffe = pytest.importorskip("griffe")


@pytest.fixture(scope="module")
def ext() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kael_docs_griffe", ROOT / "scripts" / "docs_griffe.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_an_rst_simple_table_becomes_a_markdown_table(ext: ModuleType) -> None:
    text = "\n".join(
        [
            "Before.",
            "",
            "==========  ==========",
            "``a(n)``    one line",
            "``b()``     first half,",
            "            second half",
            "``c|d``     x | y",
            "==========  ==========",
            "",
            "After: ``x = 1`` and no rule.",
        ]
    )
    assert ext.rst_tables_to_markdown(text).split("\n") == [
        "Before.",
        "",
        "| | |",
        "|---|---|",
        "| ``a(n)`` | one line |",
        "| ``b()`` | first half, second half |",
        "| ``c\\|d`` | x \\| y |",
        "",
        "After: ``x = 1`` and no rule.",
    ]
    plain = "No table here.\n\nA == B  == C"
    assert ext.rst_tables_to_markdown(plain) == plain


def test_generated_ops_are_added_with_their_runtime_docstrings(ext: ModuleType) -> None:
    import kael

    extensions = griffe.load_extensions(ext.GeneratedOps)
    pkg = griffe.load("kael", search_paths=[str(ROOT / "kael_core" / "src")], extensions=extensions)
    ops = pkg["ops"]
    for name in ("add", "exp", "eq", "maximum"):
        function = ops.members[name]
        assert function.docstring.value == getattr(kael, name).__doc__
        assert [p.name for p in function.parameters] == list(inspect.signature(getattr(kael, name)).parameters)
        assert pkg.members[name].target_path == f"kael.ops.{name}"
    assert list(pkg.exports) == list(kael.__all__)
