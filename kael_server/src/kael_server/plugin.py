"""kael plugin ``server`` (entry point group ``kael.plugins``).

It tells kael about the models shipped inside this package (``kael_bundled_models``), so that
``python -m kael generate --model kael-tiny`` and ``chat --model kael-tiny-chat`` accept them by
name as ``kael-server --data`` does. The server itself starts with the ``kael-server`` command, or
from Python with ``kael_server.load_app`` / ``kael_server.create_app``. This module stays light:
kael loads it with its plugins, which must not cost the import of the web stack.
"""

from __future__ import annotations

from pathlib import Path

import kael

__all__ = ["kael_bundled_models"]

_MODELS = Path(__file__).resolve().parent / "models"


@kael.hookimpl
def kael_bundled_models() -> dict[str, Path]:
    """The bundled checkpoints (each a directory under ``kael_server/models`` with a ``config.json``) by name."""
    if not _MODELS.is_dir():
        return {}
    return {path.name: path for path in sorted(_MODELS.iterdir()) if (path / "config.json").is_file()}
