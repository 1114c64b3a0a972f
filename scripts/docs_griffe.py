"""griffe extensions of the documentation site: generated functions, and RST tables as Markdown.

GeneratedOps: ``kael.ops`` makes one function per elementwise catalogue op at import time
(``kael.ops.POINTWISE``: ``add``, ``exp``, ``eq``, ...), so griffe's static analysis of the
source cannot see them. This extension, named under ``extensions:`` in mkdocs.yml, imports
``kael.ops`` once the ``kael`` package is loaded and adds each generated function to the
``kael.ops`` module griffe built (and to ``kael``, which re-exports them), with its runtime
signature and docstring, so the reference lists them as it lists every written function.
Everything else stays static analysis.

RstTables: kael's docstrings are read as plain text and by mkdocstrings as Markdown. Both
read ``code`` alike, but an RST simple table (columns under ``=====  =====`` rules, a
wrapped cell continued on lines whose first column is blank, as in ``kael.cpu``) is
garbled as Markdown; this extension rewrites each such table of a docstring as a Markdown
table when griffe creates the object, and leaves the source as it is.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import griffe

__all__ = ["GeneratedOps", "RstTables", "rst_tables_to_markdown"]

_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: griffe.ParameterKind.positional_only,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: griffe.ParameterKind.positional_or_keyword,
    inspect.Parameter.VAR_POSITIONAL: griffe.ParameterKind.var_positional,
    inspect.Parameter.KEYWORD_ONLY: griffe.ParameterKind.keyword_only,
    inspect.Parameter.VAR_KEYWORD: griffe.ParameterKind.var_keyword,
}


def _annotation(value: Any) -> str | None:
    if value is inspect.Parameter.empty:
        return None
    return value if isinstance(value, str) else getattr(value, "__name__", repr(value))


def _function(fn: Any, parent: griffe.Module) -> griffe.Function:
    """A griffe Function for the runtime function ``fn``: its name, parameters, return annotation, docstring."""
    signature = inspect.signature(fn)
    parameters = griffe.Parameters(
        *(
            griffe.Parameter(
                p.name,
                annotation=_annotation(p.annotation),
                kind=_KINDS[p.kind],
                default=None if p.default is inspect.Parameter.empty else repr(p.default),
            )
            for p in signature.parameters.values()
        )
    )
    function = griffe.Function(fn.__name__, parameters=parameters, returns=_annotation(signature.return_annotation))
    function.parent = parent
    if fn.__doc__:
        function.docstring = griffe.Docstring(inspect.cleandoc(fn.__doc__), parent=function)
    return function


class GeneratedOps(griffe.Extension):
    """Adds ``kael.ops.POINTWISE``'s functions to the ``kael.ops`` and ``kael`` modules griffe loads."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Once ``kael`` is loaded: add each generated function where static analysis missed it."""
        if pkg.name != "kael":
            return
        import kael.ops

        ops = pkg["ops"]
        for name, fn in kael.ops.POINTWISE.items():
            if name not in ops.members:
                ops.set_member(name, _function(fn, ops))
            if name not in pkg.members:
                pkg.set_member(name, griffe.Alias(name, ops[name], parent=pkg))
        exported = kael.__all__
        for module, names in ((pkg, exported), (ops, kael.ops.__all__)):
            module.exports = list(names)


_RULE = re.compile(r"^(=+)(\s+)(=+)\s*$")


def rst_tables_to_markdown(text: str) -> str:
    """``text`` with every two-column RST simple table rewritten as a Markdown table.

    The first column spans its rule's ``=``; a line whose first column is blank continues
    the row above. The tables kael writes have no header row, so the Markdown one is empty.
    """
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        rule = _RULE.match(lines[i])
        if not rule:
            out.append(lines[i])
            i += 1
            continue
        split = len(rule.group(1)) + len(rule.group(2))
        rows: list[list[str]] = []
        i += 1
        while i < len(lines) and not _RULE.match(lines[i]):
            first, second = lines[i][:split].strip(), lines[i][split:].strip()
            if first or not rows:
                rows.append([first, second])
            else:
                rows[-1][1] = f"{rows[-1][1]} {second}".strip()
            i += 1
        i += 1  # the closing rule
        cells = [[cell.replace("|", "\\|") for cell in row] for row in rows]
        out += ["| | |", "|---|---|", *(f"| {a} | {b} |" for a, b in cells)]
    return "\n".join(out)


class RstTables(griffe.Extension):
    """Rewrites RST simple tables in docstrings as Markdown tables (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """When griffe creates an object: convert the tables of its docstring, if any."""
        if obj.docstring is not None and "=  " in obj.docstring.value:
            obj.docstring.value = rst_tables_to_markdown(obj.docstring.value)
