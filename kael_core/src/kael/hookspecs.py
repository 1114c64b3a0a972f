"""Hook specifications for kael plugins (pluggy project name "kael").

A plugin is any object or module registered under the entry-point group
``kael.backends`` or ``kael.plugins``; it implements some of these hooks with
``@kael.hookimpl``. Hooks are called at discovery time and at well-defined
lifecycle points, never once per op: the dispatcher resolves kernels to plain
callables and caches them.

Example (a backend package's ``pyproject.toml``)::

    [project.entry-points."kael.backends"]
    mybackend = "my_package.plugin"

and ``my_package/plugin.py``::

    import kael

    @kael.hookimpl
    def kael_backends():
        return [MyBackend()]
"""

from __future__ import annotations

from typing import Any

import pluggy

__all__ = ["hookspec", "hookimpl", "KaelSpecs"]

hookspec = pluggy.HookspecMarker("kael")
hookimpl = pluggy.HookimplMarker("kael")


class KaelSpecs:
    @hookspec
    def kael_backends(self) -> list[Any]:
        """Return the Backend instances this plugin provides."""
        return []

    @hookspec
    def kael_model_families(self) -> list[Any]:
        """Return the ``kael.models.ModelFamily`` instances this plugin provides (entry-point group ``kael.models``)."""
        return []

    @hookspec
    def kael_bundled_models(self) -> dict[str, Any]:
        """Return {name: checkpoint directory} for the models this plugin ships (kael-server: ``kael-tiny``,
        ``kael-tiny-chat``), which ``python -m kael generate/chat --model NAME`` accept by name."""
        return {}

    @hookspec(firstresult=True)
    def kael_namespace(self, name: str) -> Any:
        """Return the object that serves ``kael.<name>`` (kael-debug: the ``kael_debug`` module for ``kael.debug``), or None.

        kael reaches a plugin's features only through this hook (never by importing the plugin).
        """

    @hookspec
    def kael_plugin_info(self) -> dict[str, Any]:
        """Return {"name": ..., "version": ..., "description": ...} for ``python -m kael info``."""
        return {}

    @hookspec
    def kael_backward_begin(self, roots: Any) -> None:
        """Backward is about to run from `roots` (a tuple of tensors)."""

    @hookspec
    def kael_backward_node_pre(self, node: Any, grad_outputs: Any) -> None:
        """The engine is about to run `node` with the summed incoming gradients."""

    @hookspec
    def kael_backward_node_post(self, node: Any, grad_outputs: Any, grad_inputs: Any) -> None:
        """`node` ran and produced `grad_inputs` (one per input edge, None where none)."""
