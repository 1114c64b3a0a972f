"""The architecture contracts of the root pyproject.toml (`[tool.importlinter]`, checked by
`lint-imports` in scripts/lint.sh) catch what they are written for.

* On a synthetic tree with every module the contracts name, clean imports keep every contract,
  and one planted import per rule breaks exactly that rule's contract.
* On a copy of the real packages' sources, one private import planted in kael_debug is reported
  under the public-contract rule, at its line.
* The contract's list of private modules is exactly the tree's private modules (import-linter's
  wildcards match whole names only, so the list is written out and must be kept up to date).
* kael_pytest (a single-module top-level plugin, which import-linter cannot take as a root
  package) is held to the same rule as kael.testing here.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest depends on tomli before Python 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
CONFIG: dict[str, Any] = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]
CONTRACTS: dict[str, dict[str, Any]] = {c["id"]: c for c in CONFIG["contracts"]}
PUBLIC = CONTRACTS["public-contract"]
SOURCES = {
    "kael": ROOT / "kael_core/src/kael",
    "kael_backend_cpu": ROOT / "kael_backend_cpu/src/kael_backend_cpu",
    "kael_backend_cuda": ROOT / "kael_backend_cuda/src/kael_backend_cuda",
    "kael_debug": ROOT / "kael_debug/src/kael_debug",
    "kael_server": ROOT / "kael_server/src/kael_server",
}
PLUGINS = ["kael_backend_cpu", "kael_backend_cuda", "kael_debug", "kael_server"]


def lint_imports_exe() -> str:
    beside = Path(sys.executable).with_name("lint-imports")
    exe = str(beside) if beside.exists() else shutil.which("lint-imports")
    if exe is None:
        pytest.skip("lint-imports is not installed (pip install import-linter)")
    return exe


def lint_imports(src: Path) -> tuple[int, str]:
    """Run lint-imports with the root pyproject's contracts over the packages under `src` only."""
    proc = subprocess.run(
        [lint_imports_exe(), "--no-logo", "--no-cache", str(PYPROJECT)],
        cwd=src,
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stdout + proc.stderr


def statuses(output: str) -> dict[str, str]:
    """Contract name -> "KEPT" or "BROKEN", from lint-imports' summary lines."""
    names = {c["name"] for c in CONFIG["contracts"]}
    found = {}
    for line in output.splitlines():
        m = re.fullmatch(r"(.+) (KEPT|BROKEN)", line.strip())
        if m and m.group(1) in names:
            found[m.group(1)] = m.group(2)
    return found


def broken_section(output: str, name: str) -> str:
    """The report lint-imports prints under a broken contract's heading."""
    _, _, broken = output.partition("Broken contracts")
    heading = f"\n{name}\n{'-' * len(name)}\n"
    assert heading in broken, f"no report for {name!r} in:\n{output}"
    section = broken.split(heading, 1)[1]
    for other in CONFIG["contracts"]:
        other_heading = f"\n{other['name']}\n{'-' * len(other['name'])}\n"
        section = section.split(other_heading, 1)[0]
    return section


def write_module(src: Path, module: str, code: str = "") -> Path:
    """Create `module` (as a package, with its parents) under `src`; append `code` to it."""
    path = src
    for part in module.split("."):
        path = path / part
        path.mkdir(exist_ok=True)
        (path / "__init__.py").touch()
    init = path / "__init__.py"
    with init.open("a", encoding="utf-8") as f:
        f.write(code)
    return init


# --- a synthetic tree: every module the contracts name, and imports that keep them ---------

CLEAN_IMPORTS = {
    # The frontend's own modules use its private modules, and the dispatcher reaches the
    # reference backend: both are allowed.
    "kael": "from kael import _tensor, _dispatch, ops, nn, autograd, models, optim, io\n",
    "kael._dispatch": "from kael.backends import reference\n",
    "kael.ops": "from kael import _dispatch, _tensor\nfrom kael.autograd import _function\n",
    # The conformance kit uses its own private modules and kael's public names.
    "kael.testing": "import kael\nfrom kael.testing import _own\nfrom kael.backends import reference\n",
    # Plugins use public names; a private one only for type checking.
    **{
        name: "import kael\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kael._tensor import Tensor\n"
        for name in PLUGINS
    },
}

# One planted import per rule: (importer, import statement, the contract it breaks).
PLANTS = [
    ("kael_debug", "from kael._tensor import Tensor\n", "public-contract"),
    ("kael_server", "from kael.autograd._function import Function\n", "public-contract"),
    ("kael.testing", "from kael._dtype import float32\n", "public-contract"),
    ("kael_backend_cpu", "from kael.backends import reference\n", "independent-backends"),
    ("kael_backend_cuda", "import kael_backend_cpu\n", "independent-backends"),
    ("kael.models", "import kael_server\n", "frontend-no-plugins"),
    ("kael", "import kael_debug\n", "frontend-no-plugins"),
    ("kael.nn", "from kael.backends.reference import ReferenceBackend\n", "ops-through-dispatch"),
]


def synthetic_tree(src: Path) -> None:
    names = set(CONFIG["root_packages"])
    for contract in CONFIG["contracts"]:
        names |= set(contract["source_modules"]) | set(contract["forbidden_modules"])
    assert not any("*" in n for n in names), "the synthetic tree cannot build wildcards"
    for name in sorted(names | {"kael.testing._own"}):
        write_module(src, name)
    for name, code in CLEAN_IMPORTS.items():
        write_module(src, name, code)


def test_synthetic_tree_keeps_every_contract(tmp_path: Path) -> None:
    synthetic_tree(tmp_path)
    rc, out = lint_imports(tmp_path)
    assert rc == 0, out
    assert statuses(out) == {c["name"]: "KEPT" for c in CONFIG["contracts"]}, out


@pytest.mark.parametrize(("importer", "code", "contract"), PLANTS, ids=[f"{p[0]}-{p[2]}" for p in PLANTS])
def test_planted_import_breaks_its_contract(tmp_path: Path, importer: str, code: str, contract: str) -> None:
    synthetic_tree(tmp_path)
    write_module(tmp_path, importer, code)
    rc, out = lint_imports(tmp_path)
    assert rc != 0, out
    expected = {c["name"]: "BROKEN" if c["id"] == contract else "KEPT" for c in CONFIG["contracts"]}
    assert statuses(out) == expected, out
    # The report names the planted import itself.
    assert f"{importer} -> " in broken_section(out, CONTRACTS[contract]["name"]), out


# --- a copy of the real sources, with one private import planted --------------------------


def copy_sources(dst: Path) -> None:
    """The Python files of every root package (no weights, caches or built extensions)."""

    def ignore(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n == "__pycache__" or ((Path(folder) / n).is_file() and not n.endswith(".py"))]

    for name in CONFIG["root_packages"]:
        shutil.copytree(SOURCES[name], dst / name, ignore=ignore)


def test_private_import_planted_in_real_kael_debug_is_reported(tmp_path: Path) -> None:
    copy_sources(tmp_path)
    target = tmp_path / "kael_debug" / "__init__.py"
    planted = f"kael_debug -> kael._tensor (l.{len(target.read_text(encoding='utf-8').splitlines()) + 1})"
    name = PUBLIC["name"]

    _, before = lint_imports(tmp_path)
    assert name in statuses(before), before  # the contracts were checked, not an error
    assert planted not in before

    with target.open("a", encoding="utf-8") as f:
        f.write("from kael._tensor import Tensor as _planted\n")
    rc, after = lint_imports(tmp_path)
    assert rc != 0, after
    assert statuses(after)[name] == "BROKEN", after
    assert planted in broken_section(after, name), after


# --- the written-out list of private modules ------------------------------------------------


def is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_modules(package: str, folder: Path) -> set[str]:
    """Every module or package of the tree with a private name, at its outermost private part."""
    found = set()
    for path in folder.rglob("*.py"):
        parts = [package, *path.relative_to(folder).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        for i, part in enumerate(parts[1:], start=1):
            if is_private(part):
                found.add(".".join(parts[: i + 1]))
                break
    return found


def test_forbidden_list_names_every_private_module_of_kael() -> None:
    tree = {m for m in private_modules("kael", SOURCES["kael"]) if not m.startswith("kael.testing.")}
    listed = set(PUBLIC["forbidden_modules"])
    assert not (tree - listed), f"add to the public-contract forbidden_modules: {sorted(tree - listed)}"
    assert not (listed - tree), f"remove from the public-contract forbidden_modules: {sorted(listed - tree)}"


def test_contract_sources_are_the_plugins_and_the_conformance_kit() -> None:
    assert set(PUBLIC["source_modules"]) == {*PLUGINS, "kael.testing"}
    assert CONFIG["exclude_type_checking_imports"] is True


# --- kael_pytest: the same rule, checked here ---------------------------------------------


def imported_modules(tree: ast.Module) -> list[tuple[str, int]]:
    """(module, line) of each import outside `if TYPE_CHECKING:` blocks; for `from X import Y`
    both X and X.Y (Y may be a submodule)."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
            found.extend((f"{node.module}.{alias.name}", node.lineno) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def test_imported_modules_skips_type_checking_blocks() -> None:
    code = (
        "import a\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\n"
        "def f():\n    from d import e\n"
    )
    assert imported_modules(ast.parse(code)) == [
        ("a", 1),
        ("typing", 2),
        ("typing.TYPE_CHECKING", 2),
        ("c", 6),
        ("d", 8),
        ("d.e", 8),
    ]


def test_kael_pytest_imports_only_public_modules() -> None:
    path = SOURCES["kael"].parent / "kael_pytest.py"
    bad = sorted(
        {
            (line, private)
            for module, line in imported_modules(ast.parse(path.read_text(encoding="utf-8")))
            for private in PUBLIC["forbidden_modules"]
            if module == private or module.startswith(private + ".")
        }
    )
    assert not bad, "kael_pytest imports private kael modules: " + ", ".join(
        f"kael_pytest -> {private} (l.{line})" for line, private in bad
    )
