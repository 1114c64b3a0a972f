"""A test helper: third-party plugin dists installed on the fly, for the plugin tests.

``install`` writes a package (one module per plugin) and a ``.dist-info`` whose
``entry_points.txt`` registers it, exactly what ``pip install`` would leave, into a
directory that the caller puts on the path. ``PRIMITIVES_ONLY`` is the source of a backend
plugin with the reference kernels and no fused op; ``RAISES`` a plugin that fails to import.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

__all__ = ["PRIMITIVES_ONLY", "RAISES", "install"]

PRIMITIVES_ONLY = """
    import kael
    from kael.backends.reference import ReferenceBackend


    class PrimitivesOnly(ReferenceBackend):
        '''The reference kernels without a single fused op: every fused op runs its decomposition.'''

        name = "primonly"
        priority = 5

        def __init__(self):
            super().__init__(fused=False)


    @kael.hookimpl
    def kael_backends():
        return [PrimitivesOnly()]
"""

RAISES = """
    raise RuntimeError("boom while importing the plugin")
"""


def install(root: Path, dist: str, plugins: dict[str, dict[str, str]]) -> Path:
    """Write package `dist` (one module per plugin) and its dist-info under root; return root.

    plugins: {entry-point group: {plugin name: module source}}.
    """
    pkg = root / dist
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    lines = []
    for group, entries in plugins.items():
        lines.append(f"[{group}]")
        for name, source in entries.items():
            mod = name.replace("-", "_")
            (pkg / f"{mod}.py").write_text(textwrap.dedent(source))
            lines.append(f"{name} = {dist}.{mod}")
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return root
