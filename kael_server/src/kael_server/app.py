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
from kael_server.auth import RequireApiKey, document_api_keys
from kael_server.config import ServerConfig
from kael_server.deadline import check_request_timeout, document_deadline
from kael_server.errors import client_error
from kael_server.generator import Generator
from kael_server.metrics import Metrics
from kael_server.routes import ROUTES
from kael_server.schemas import ErrorResponse
from kael_server.state import Loader, ServerState

__all__ = ["create_app"]

DOCS_PATH = "/schema"


def create_app(
    generator: Generator | Loader,
    config: ServerConfig | None = None,
    *,
    on_load_error: Callable[[BaseException], None] | None = None,
) -> Litestar:
    """The server for ``generator``, or for the Generator that ``loader(metrics)`` builds on a
    thread at start-up (``/ready`` answers 503 until it is done), set up as ``config`` says
    (default: ``ServerConfig()``, kael-server's defaults; the one declaration of its settings).

    With ``config.api_keys``, every route but ``/health``, ``/ready``, the playground page, the
    OpenAPI document and (unless ``config.protect_metrics``) ``/metrics`` needs
    ``Authorization: Bearer KEY`` (kael_server.auth). A generation still running
    ``config.request_timeout`` seconds after its request arrived is stopped (504, or a stream's
    final error event; kael_server.deadline).

    ``app.state.server`` is the ServerState: the CLI uses it to drain on SIGTERM.
    """
    config = config if config is not None else ServerConfig()
    keys, protect_metrics = config.api_keys, config.protect_metrics
    timeout = check_request_timeout(config.request_timeout)
    if isinstance(generator, Generator):
        server = ServerState(generator.metrics, generator=generator, request_timeout=timeout)
    else:
        server = ServerState(Metrics(), loader=generator, on_load_error=on_load_error, request_timeout=timeout)

    def provide_server() -> ServerState:
        return server

    app = Litestar(
        route_handlers=ROUTES,
        dependencies={"server": Provide(provide_server, use_cache=True, sync_to_thread=False)},
        middleware=[
            DefineMiddleware(RequestAccounting, metrics=server.metrics),  # outermost: a 401 is logged too
            DefineMiddleware(RequireApiKey, keys=keys, protect_metrics=protect_metrics, docs_path=DOCS_PATH),
        ],
        on_startup=[server.startup],
        on_shutdown=[server.shutdown],
        exception_handlers={Exception: _internal_error},
        openapi_config=OpenAPIConfig(title="kael-server", version=__version__, path=DOCS_PATH),
        request_max_body_size=max(limits.MAX_BODY_BYTES, limits.MAX_OPENAI_BODY_BYTES),
        logging_config=None,
        state=State({"server": server}),
    )
    if keys:
        document_api_keys(app, protect_metrics)
    if timeout is not None:
        document_deadline(app)
    return app


def _internal_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Litestar's own HTTP errors (404, 405, ...) as they are; anything else as a bare 500."""
    if isinstance(exc, HTTPException):
        return Response(ErrorResponse(detail=exc.detail), status_code=exc.status_code, headers=exc.headers)
    failure = client_error(exc, request_id_of(request), "internal server error")
    return Response(ErrorResponse(detail=failure.message), status_code=failure.status_code)
