"""A real kael-server process (uvicorn, signals, sockets) around a slow fake model.

Run as a script by test_uvicorn.py: ``python fake_server.py PORT``. It serves the same
app as ``kael-server`` would, through the same ``draining_server``, so SIGTERM and client
disconnects are tested over real sockets without needing kael's GPT-2.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fakes import ByteTokenizer, FakeModel  # noqa: E402
from kael_server.cli import draining_server  # noqa: E402
from kael_server.logs import configure_logging  # noqa: E402

from kael_server import Generator, create_app  # noqa: E402

if __name__ == "__main__":
    configure_logging("json")
    model = FakeModel(max_positions=1024, step_seconds=0.02)
    app = create_app(Generator(model, ByteTokenizer(), make_rng=random.Random))
    draining_server(app, "127.0.0.1", int(sys.argv[1]), "warning").run()
