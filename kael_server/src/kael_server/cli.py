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
from kael_server.auth import ENV_VAR, configured_keys
from kael_server.errors import ServerConfigError
from kael_server.loading import WEIGHTS, load_app
from kael_server.logs import configure_logging, get_logger
from kael_server.state import ServerState

__all__ = ["DrainingServer", "build_parser", "draining_server", "listening_socket", "main", "version_text"]

MAX_PORT = 65535


def version_text() -> str:
    """``kael-server X (kael-core Y, Python Z)``: what ``--version`` prints."""
    try:
        core = metadata.version("kael-core")
    except metadata.PackageNotFoundError:
        core = "not installed"
    python = ".".join(map(str, sys.version_info[:3]))
    return f"kael-server {__version__} (kael-core {core}, Python {python})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kael-server",
        description="Serve text generation over HTTP (plain JSON, server-sent events, "
        "and OpenAI-compatible /v1/completions and /v1/chat/completions).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument(
        "--data",
        metavar="DIR",
        default=None,
        help="checkpoint directory (config.json, model.safetensors, and tokenizer.json or vocab.json + "
        "merges.txt; a chat template for /v1/chat/completions), or the name of a bundled model: kael-tiny "
        "(the default) or kael-tiny-chat (a Llama-architecture model with a chat template), or a llama.cpp "
        "GGUF file (model.gguf: GPT-2, Llama or Qwen2 with its tokenizer)",
    )
    parser.add_argument("--device", default="cpu", help="kael device to run the model on, e.g. cpu or cuda")
    parser.add_argument(
        "--weights",
        choices=WEIGHTS,
        default=None,
        help="load the weights in this format: f32, bf16, f16, or GGML's q8_0 / q4_0 blocks (projections and "
        "token table, as llama.cpp's default quantization; norms and biases stay float32); default: as stored",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help=f"TCP port to listen on (1 to {MAX_PORT})")
    parser.add_argument(
        "--slots",
        type=_at_least(1),
        default=1,
        metavar="N",
        help="generations run at once: the largest batch; with N > 1 they share each decode step (continuous "
        "batching over a paged KV cache, which holds --kv-cache-tokens positions)",
    )
    parser.add_argument(
        "--kv-cache-tokens",
        type=_at_least(1),
        default=None,
        metavar="T",
        help="positions the paged KV cache holds in all, in blocks of 16 (default: N full contexts for "
        "--slots N); many short sequences fit where N full contexts would not; when it runs out, the "
        "newest sequence is preempted and recomputed later (same output); turns batching on with one slot",
    )
    parser.add_argument(
        "--no-prefix-cache",
        action="store_true",
        help="do not reuse the keys and values of a prompt's cached prefix (automatic prefix caching is on "
        "by default with batching: blocks of the same tokens in the same model are shared)",
    )
    parser.add_argument(
        "--queue",
        type=_at_least(0),
        default=0,
        metavar="Q",
        help="requests that may wait for a busy slot; beyond it, or past --queue-timeout, 429 with Retry-After",
    )
    parser.add_argument(
        "--queue-timeout",
        type=_seconds,
        default=10.0,
        metavar="S",
        help="seconds a queued request waits for a slot before it is answered 429",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a generation may take from its request's arrival; past it, it stops and its slot is "
        "freed (a plain request gets 504, a stream a final error event); default: no limit",
    )
    parser.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on every generation and tokenizer route (repeatable: any "
        f"of the keys works); a key on the command line is visible to other local users, so prefer "
        f"--api-key-file or the {ENV_VAR} environment variable, which add keys the same way",
    )
    parser.add_argument(
        "--api-key-file",
        metavar="FILE",
        default=None,
        help="a file of API keys, one a line (blank lines and lines starting with # are ignored)",
    )
    parser.add_argument(
        "--protect-metrics",
        action="store_true",
        help="with API keys, /metrics needs a key too (/health and /ready always stay open)",
    )
    parser.add_argument(
        "--log-format",
        choices=("console", "json"),
        default="console",
        help="one line per event (each request, and uvicorn's own lines), as readable text or as JSON objects",
    )
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="lowest level of log lines written",
    )
    return parser


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value <= 3600:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"must be between 0 and 3600 seconds, got {text}")
    return value


def _check_port(port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= MAX_PORT:
        raise ServerConfigError(f"--port must be a TCP port from 1 to {MAX_PORT}, got {port!r}")


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
        _check_port(args.port)  # the cheap checks first
        keys = configured_keys(args.api_key, args.api_key_file)
        app = load_app(
            args.data,
            args.device,
            on_load_error=stop_on_load_error,
            slots=args.slots,
            queue=args.queue,
            queue_timeout=args.queue_timeout,
            api_keys=keys,
            protect_metrics=args.protect_metrics,
            request_timeout=args.request_timeout,
            weights=args.weights,
            kv_cache_tokens=args.kv_cache_tokens,
            prefix_cache=not args.no_prefix_cache,
        )
        sock = listening_socket(args.host, args.port)
    except (ServerConfigError, ImportError) as exc:
        print(f"kael-server: {exc}", file=sys.stderr)
        return 2
    log.info(
        "starting",
        host=args.host,
        port=args.port,
        device=args.device,
        weights=args.weights,
        slots=args.slots,
        kv_cache_tokens=args.kv_cache_tokens,
        prefix_cache=not args.no_prefix_cache,
        queue=args.queue,
        request_timeout=args.request_timeout,
        api_keys=len(keys),  # how many, never which
        protect_metrics=args.protect_metrics,
    )
    server = draining_server(app, args.host, args.port, args.log_level)
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
