"""A test helper: run kael's ``cpu`` device on a reference backend without fused kernels, so every
fused op runs its decomposition into primitives (``fused_mode`` fixtures of the fused-op tests)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kael
from kael.backends.reference import ReferenceBackend

__all__ = ["decompositions", "modes"]


@contextmanager
def decompositions(tag: str) -> Iterator[None]:
    """Within it, ``cpu`` is served by a reference backend named ``reference_<tag>`` with no fused
    kernels (registered through a plugin, unregistered on exit)."""
    backend = ReferenceBackend(fused=False)
    backend.name = f"reference_{tag}"
    backend.priority = -1

    class Plugin:
        @kael.hookimpl
        def kael_backends(self) -> list[Any]:
            return [backend]

    plugin_name = f"test_{tag}_backend"
    kael.backends.register(Plugin(), plugin_name)
    kael.backends.use("cpu", backend.name)
    try:
        yield
    finally:
        kael.backends.use("cpu", None)
        from kael._plugins import manager

        manager.unregister(plugin_name)


def modes(param: str, tag: str) -> Iterator[str]:
    """A fixture body: ``param`` ("fused_kernel": the current backend; "decomposition": the
    decompositions, ``decompositions(tag)``) yielded while it is in force."""
    if param == "fused_kernel":
        yield param
        return
    with decompositions(tag):
        yield param
