"""The ``kael-server`` command: parse flags, load the checkpoint, serve with uvicorn, drain on exit."""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections.abc import Callable, Sequence
from types import FrameType

import uvicorn
from litestar import Litestar

from kael_server import limits
from kael_server.loading import ServerConfigError, load_app
from kael_server.logs import configure_logging, get_logger
from kael_server.state import ServerState


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kael-server",
        description="Serve GPT-2 text generation over HTTP (plain JSON, server-sent events, "
        "and an OpenAI-compatible /v1/completions).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--data",
        metavar="DIR",
        default=None,
        help="checkpoint directory (config.json, model.safetensors, vocab.json, merges.txt); "
        "without it, the model bundled with kael-server",
    )
    parser.add_argument("--device", default="cpu", help="kael device to run the model on, e.g. cpu or cuda")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    parser.add_argument(
        "--slots",
        type=_at_least(1),
        default=1,
        metavar="N",
        help="generations run at once; with N > 1 they share each decode step (continuous batching over a "
        "KV cache of N rows, which holds N full contexts in memory)",
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
        "--log-format",
        choices=("console", "json"),
        default="console",
        help="one line per request, as readable text or as JSON objects",
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


class DrainingServer(uvicorn.Server):
    """uvicorn, but on SIGINT/SIGTERM it first stops running generations (``on_exit``), so open
    streams end at once with an error event instead of holding the shutdown until they finish."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is not None and not self.should_exit:
            # A signal handler may interrupt the loop anywhere: hand the work to the loop.
            self._loop.call_soon_threadsafe(self._on_exit)
        super().handle_exit(sig, frame)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    log = get_logger()
    server: DrainingServer | None = None

    def stop_on_load_error(exc: BaseException) -> None:
        if server is not None:
            server.should_exit = True

    try:
        app = load_app(
            args.data,
            args.device,
            on_load_error=stop_on_load_error,
            slots=args.slots,
            queue=args.queue,
            queue_timeout=args.queue_timeout,
        )
    except (ServerConfigError, ImportError) as exc:
        print(f"kael-server: {exc}", file=sys.stderr)
        return 2
    log.info("starting", host=args.host, port=args.port, device=args.device, slots=args.slots, queue=args.queue)
    server = draining_server(app, args.host, args.port, args.log_level)
    server.run()
    return 1 if app.state.server.load_error is not None else 0


def draining_server(app: Litestar, host: str, port: int, log_level: str = "info") -> DrainingServer:
    """uvicorn serving ``app`` (from create_app or load_app), draining it on SIGINT/SIGTERM."""
    state: ServerState = app.state.server
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        access_log=False,  # RequestAccounting writes one structured line per request
        timeout_graceful_shutdown=int(limits.SHUTDOWN_DRAIN_SECONDS),
        log_level=log_level,
    )
    return DrainingServer(config, on_exit=state.begin_drain)


if __name__ == "__main__":
    sys.exit(main())
