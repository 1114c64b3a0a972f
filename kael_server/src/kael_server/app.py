"""create_app: the Litestar application around a Generator (or a loader that builds one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litestar import Litestar, Request, Response
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import HTTPException
from litestar.middleware import DefineMiddleware
from litestar.openapi import OpenAPIConfig

from kael_server import __version__, limits
from kael_server.accounting import RequestAccounting, request_id_of
from kael_server.errors import client_error
from kael_server.generator import Generator
from kael_server.metrics import Metrics
from kael_server.routes import ROUTES
from kael_server.schemas import ErrorResponse
from kael_server.state import Loader, ServerState


def create_app(
    generator: Generator | Loader,
    *,
    on_load_error: Callable[[BaseException], None] | None = None,
) -> Litestar:
    """The server for ``generator``, or for the Generator that ``loader(metrics)`` builds on a
    thread at start-up (``/ready`` answers 503 until it is done).

    ``app.state.server`` is the ServerState: the CLI uses it to drain on SIGTERM.
    """
    if isinstance(generator, Generator):
        server = ServerState(generator.metrics, generator=generator)
    else:
        server = ServerState(Metrics(), loader=generator, on_load_error=on_load_error)

    def provide_server() -> ServerState:
        return server

    return Litestar(
        route_handlers=ROUTES,
        dependencies={"server": Provide(provide_server, use_cache=True, sync_to_thread=False)},
        middleware=[DefineMiddleware(RequestAccounting, metrics=server.metrics)],
        on_startup=[server.startup],
        on_shutdown=[server.shutdown],
        exception_handlers={Exception: _internal_error},
        openapi_config=OpenAPIConfig(title="kael-server", version=__version__),
        request_max_body_size=limits.MAX_BODY_BYTES,
        logging_config=None,
        state=State({"server": server}),
    )


def _internal_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Litestar's own HTTP errors (404, 405, ...) as they are; anything else as a bare 500."""
    if isinstance(exc, HTTPException):
        return Response(ErrorResponse(detail=exc.detail), status_code=exc.status_code, headers=exc.headers)
    failure = client_error(exc, request_id_of(request), "internal server error")
    return Response(ErrorResponse(detail=failure.message), status_code=failure.status_code)
