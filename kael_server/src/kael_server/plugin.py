"""kael plugin ``server`` (entry point group ``kael.plugins``).

kael-server adds no hooks to kael yet: registering makes it show up in ``python -m kael info``.
The server itself is started with the ``kael-server`` command or ``kael_server.load_app``.
"""

from __future__ import annotations

name = "server"
