"""The ``kael-server`` command: parse flags, check them, load the checkpoint, serve with uvicorn, drain on exit.

Everything that can be refused is refused before the server listens, with one line on
stderr and exit status 2: a bad flag value, a checkpoint directory that is incomplete, a
device kael cannot use, an API key file that cannot be read, an address already in use.
SIGINT (Ctrl+C) and SIGTERM drain the running generations and end with status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from types import FrameType

import uvicorn
from litestar import Litestar

from kael_server import __version__, limits
from kael_server.config import PortRule, ServerConfig, add_server_arguments
from kael_server.errors import ServerConfigError
from kael_server.loading import load_app
from kael_server.logs import configure_logging, get_logger
from kael_server.state import ServerState

__all__ = ["DrainingServer", "build_parser", "draining_server", "listening_socket", "main", "version_text"]


def version_text() -> str:
    """``kael-server X (kael-core Y, Python Z)``: what ``--version`` prints."""
    try:
        core = metadata.version("kael-core")
    except metadata.PackageNotFoundError:
        core = "not installed"
    python = ".".join(map(str, sys.version_info[:3]))
    return f"kael-server {__version__} (kael-core {core}, Python {python})"


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``kael-server``: ``--version`` and every ServerConfig flag (kael_server.config)."""
    parser = argparse.ArgumentParser(
        prog="kael-server",
        description="Serve text generation over HTTP (plain JSON, server-sent events, "
        "and OpenAI-compatible /v1/completions and /v1/chat/completions).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_text())
    add_server_arguments(parser)
    return parser


def _check_port(port: int) -> None:
    PortRule().check("--port", port)


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (not listening yet); ServerConfigError if it cannot be."""
    _check_port(port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise ServerConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServerConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


class DrainingServer(uvicorn.Server):
    """uvicorn, but on SIGINT/SIGTERM it first stops running generations (``on_exit``), so open
    streams end at once with an error event instead of holding the shutdown until they finish.

    After the drain the process ends normally (exit status 0): uvicorn would raise the signal
    again once it has shut down, which a SIGINT turns into a KeyboardInterrupt traceback.
    """

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started and sockets:  # uvicorn announces only the sockets it binds itself
            host, port = sockets[0].getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            get_logger().info("listening", url=f"http://{shown}:{port}")

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        handled = [signal.SIGINT, signal.SIGTERM]
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is not None and not self.should_exit:
            # A signal handler may interrupt the loop anywhere: hand the work to the loop.
            self._loop.call_soon_threadsafe(self._on_exit)
        super().handle_exit(sig, frame)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``kael-server`` command: parse ``argv`` (``sys.argv[1:]`` when None), load the model and serve it
    until SIGINT/SIGTERM, which first stops running generations.

    Returns the exit status: 0 after a normal shutdown, 1 when the model failed to load, 2 for a configuration
    error such as a port in use or a missing key file (the message goes to stderr; argparse itself exits with 2
    on a malformed option), 130 when interrupted before the server started.
    """
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl+C before the server (and its own signal handling) started
        print("kael-server: interrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    log = get_logger()
    server: DrainingServer | None = None

    def stop_on_load_error(exc: BaseException) -> None:
        if server is not None:
            server.should_exit = True

    try:
        config = ServerConfig.from_args(args)  # every flag checked, the API keys read
        app = load_app(config, on_load_error=stop_on_load_error)
        sock = listening_socket(config.host, config.port)
    except (ServerConfigError, ImportError) as exc:
        print(f"kael-server: {exc}", file=sys.stderr)
        return 2
    log.info(
        "starting",
        host=config.host,
        port=config.port,
        device=config.device,
        weights=config.weights,
        slots=config.slots,
        kv_cache_tokens=config.kv_cache_tokens,
        prefix_cache=config.prefix_cache,
        speculative=config.speculative,
        spec_tokens=config.spec_tokens if config.speculative else None,
        queue=config.queue,
        request_timeout=config.request_timeout,
        api_keys=len(config.api_keys),  # how many, never which
        protect_metrics=config.protect_metrics,
    )
    server = draining_server(app, config.host, config.port, config.log_level)
    with sock:
        server.run(sockets=[sock])
    return 1 if app.state.server.load_error is not None else 0


def draining_server(app: Litestar, host: str, port: int, log_level: str = "info") -> DrainingServer:
    """uvicorn serving ``app`` (from create_app or load_app), draining it on SIGINT/SIGTERM.

    uvicorn's own log lines go through the logging that ``configure_logging`` set up (the
    same console or JSON format as the request lines).
    """
    state: ServerState = app.state.server
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        access_log=False,  # RequestAccounting writes one structured line per request
        log_config=None,
        timeout_graceful_shutdown=int(limits.SHUTDOWN_DRAIN_SECONDS),
        log_level=log_level,
    )
    return DrainingServer(config, on_exit=state.begin_drain)


if __name__ == "__main__":
    sys.exit(main())
