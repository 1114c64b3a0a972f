"""``kael.debug``: the features of a debug plugin (kael-debug), found through the plugin manager.

``kael.debug.explain``, ``kael.debug.profile``, ... are the attributes of the object a
``kael.plugins`` entry point returns from the ``kael_namespace("debug")`` hook; kael
never imports the plugin package itself. Without such a plugin (not installed, or
plugins turned off with ``KAEL_DISABLE_PLUGIN_AUTOLOAD=1`` or ``KAEL_BLOCK_PLUGINS``),
reaching an attribute raises a PluginError saying how to install it.
"""

from __future__ import annotations

from typing import Any

from ._errors import PluginError

__all__: list[str] = []


def _namespace() -> Any:
    from ._plugins import manager

    manager.ensure_loaded("kael.plugins")
    found = manager.pm.hook.kael_namespace(name="debug")
    if found is None:
        raise PluginError(
            "kael.debug needs a debug plugin: pip install kael-debug (or pip install ./kael_debug from a kael "
            "checkout); it registers under the kael.plugins entry point, so plugin autoloading must be on"
        )
    return found


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(_namespace(), name)
