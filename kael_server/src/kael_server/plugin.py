"""kael plugin ``server`` (entry point group ``kael.plugins``).

kael-server implements no kael hooks yet; registering makes it show up among kael's plugins
(``python -m kael info``). The server itself starts with the ``kael-server`` command, or from
Python with ``kael_server.load_app`` / ``kael_server.create_app``.
"""

__all__: list[str] = []
