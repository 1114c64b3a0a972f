"""``kael.debug``: the kael-debug plugin's features, reached without importing it eagerly."""

from __future__ import annotations

from typing import Any

from ._errors import PluginError


def __getattr__(name: str) -> Any:
    try:
        import kael_debug
    except ImportError:
        raise PluginError(
            "kael.debug needs the kael-debug package: pip install kael-debug "
            "(or pip install ./kael_debug from a kael checkout)"
        ) from None
    return getattr(kael_debug, name)
