"""The autograd graph as Graphviz DOT, and rendering it through `dot`."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import deque
from typing import Any

from kael import KaelError, Tensor
from kael.autograd import get_gradient_edge

__all__ = ["autograd_graph_dot", "render_graph"]


def autograd_graph_dot(t: Tensor) -> str:
    """DOT of the graph backward would walk from t.

    Nodes are numbered in breadth-first discovery order and printed once; each
    input edge is printed (twice when an input is used twice), labelled with the
    shape of the gradient that flows along it.
    """
    lines = ["digraph autograd {"]
    root: Any = get_gradient_edge(t).node if t.grad_fn is not None or t.requires_grad else None
    if root is not None:
        ids = {root: 0}
        lines.append(f'  n0 [label="{root.name()}"];')
        queue = deque([root])
        while queue:
            node = queue.popleft()
            for edge, shape in zip(node.next_functions, _edge_shapes(node)):
                if edge is None:
                    continue
                nxt = edge[0]
                if nxt not in ids:
                    ids[nxt] = len(ids)
                    lines.append(f'  n{ids[nxt]} [label="{nxt.name()}"];')
                    queue.append(nxt)
                lines.append(f'  n{ids[node]} -> n{ids[nxt]} [label="{list(shape)}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _edge_shapes(node: Any) -> tuple[Any, ...]:
    shapes = tuple(node.input_shapes)
    return shapes + ((),) * (len(node.next_functions) - len(shapes))


def render_graph(t: Tensor, path: str | os.PathLike[str]) -> None:
    """Write the graph as PNG or SVG (by extension) with Graphviz's `dot`."""
    p = os.fspath(path)
    fmt = os.path.splitext(p)[1].lower().lstrip(".")
    if fmt not in ("png", "svg"):
        raise KaelError(f"render_graph: unsupported file type {fmt!r} for {p!r}; expected .png or .svg")
    exe = shutil.which("dot")
    if exe is None:
        raise KaelError(
            "render_graph: Graphviz's `dot` program was not found on PATH; install Graphviz "
            "(e.g. apt-get install graphviz) or use autograd_graph_dot() for the DOT text"
        )
    tmp = f"{p}.tmp{os.getpid()}"
    try:
        subprocess.run(
            [exe, f"-T{fmt}", "-o", tmp],
            input=autograd_graph_dot(t).encode(),
            check=True,
            capture_output=True,
            timeout=60,
        )
        os.replace(tmp, p)
    except subprocess.CalledProcessError as exc:
        raise KaelError(f"render_graph: dot failed: {exc.stderr.decode(errors='replace').strip()}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
