"""API keys: which routes need ``Authorization: Bearer KEY``, and the check itself.

Keys come from ``--api-key KEY`` (repeatable), ``--api-key-file FILE`` (one key per line,
blank lines and ``#`` comment lines ignored) and the ``KAEL_API_KEY`` environment variable.
With any key configured, every route needs one, except the open ones: ``/health``,
``/ready``, the playground page (it asks for the key itself), the OpenAPI document,
``OPTIONS`` requests and, unless ``--protect-metrics``, ``/metrics``. A route opts out with
``opt={"auth": "open"}`` (``"metrics"`` for the metrics route), so a new route is protected
unless it says otherwise.

NOTE [api key secrecy]: a key is never logged, never put in an error message and never
compared byte by byte: the server keeps only the SHA-256 digest of each key and compares
the digest of what a client sent with every one of them (``hmac.compare_digest``, all of
them every time), so neither the answer's timing nor its text tells anything about a key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import msgspec
from litestar import Litestar
from litestar.openapi.spec import Components, OpenAPIMediaType, OpenAPIResponse, Schema, SecurityScheme
from litestar.types import ASGIApp, HTTPResponseBodyEvent, HTTPResponseStartEvent, Receive, Scope, Send

from kael_server.errors import ServerConfigError
from kael_server.openapi import schema_of
from kael_server.schemas import OpenAIError, OpenAIErrorResponse

__all__ = [
    "ENV_VAR",
    "ApiKeys",
    "RequireApiKey",
    "configured_keys",
    "document_api_keys",
    "read_key_file",
]

ENV_VAR = "KAEL_API_KEY"
SECURITY_SCHEME = "bearer"
_CHALLENGE = 'Bearer realm="kael-server"'
MISSING = "this server needs an API key: send it as the header Authorization: Bearer KEY"
WRONG = "the API key is not valid"


def _check_key(key: str, where: str) -> bytes:
    """The key as bytes, if it can travel in an HTTP header; ServerConfigError (not naming it) otherwise."""
    if not key:
        raise ServerConfigError(f"{where}: an API key may not be empty")
    if not all("!" <= c <= "~" for c in key):
        raise ServerConfigError(f"{where}: an API key must be printable ASCII characters without spaces")
    return key.encode("ascii")


class ApiKeys:
    """The configured keys, as SHA-256 digests; empty means the server is open."""

    def __init__(self, keys: Iterable[str] = (), where: str = "--api-key") -> None:
        self._digests = tuple(hashlib.sha256(_check_key(k, where)).digest() for k in keys)

    def __len__(self) -> int:
        return len(self._digests)

    def __bool__(self) -> bool:
        return bool(self._digests)

    def __repr__(self) -> str:
        return f"ApiKeys({len(self)} key{'s' if len(self) != 1 else ''})"  # never the keys

    def accepts(self, presented: bytes) -> bool:
        """Whether ``presented`` is one of the keys (constant time over all of them)."""
        digest = hashlib.sha256(presented).digest()
        found = False
        for known in self._digests:
            found |= hmac.compare_digest(digest, known)
        return found

    def check(self, authorization: bytes | None) -> str | None:
        """None when the ``Authorization`` header value carries a valid key, else what to tell the client."""
        if authorization is None:
            return MISSING
        scheme, _, token = authorization.strip().partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return MISSING
        return None if self.accepts(token.strip()) else WRONG


def read_key_file(path: str | os.PathLike[str]) -> list[str]:
    """The keys in ``path``, one a line (surrounding whitespace, blank lines and lines starting
    with ``#`` ignored); ServerConfigError if it cannot be read or holds no key."""
    where = f"--api-key-file {str(path)!r}"
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise ServerConfigError(f"{where} cannot be read: {exc.strerror or type(exc).__name__}") from None
    except UnicodeDecodeError:
        raise ServerConfigError(f"{where} is not UTF-8 text") from None
    keys = []
    for number, line in enumerate(text.splitlines(), 1):
        key = line.strip()
        if key and not key.startswith("#"):
            _check_key(key, f"{where} line {number}")
            keys.append(key)
    if not keys:
        raise ServerConfigError(f"{where} holds no API key (blank lines and # comment lines are ignored)")
    return keys


def configured_keys(
    keys: Sequence[str] = (), key_file: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> ApiKeys:
    """Every key from the flags, the key file and ``KAEL_API_KEY`` (an empty variable is unset)."""
    environ = os.environ if environ is None else environ
    all_keys = list(keys)
    for key in all_keys:
        _check_key(key, "--api-key")
    if key_file is not None:
        all_keys += read_key_file(key_file)
    if env := environ.get(ENV_VAR, "").strip():
        _check_key(env, ENV_VAR)
        all_keys.append(env)
    return ApiKeys(all_keys)


def _opted_out(opt: Mapping[str, object], protect_metrics: bool) -> bool:
    """Whether a route's ``opt`` makes it open."""
    kind = opt.get("auth")
    return kind == "open" or (kind == "metrics" and not protect_metrics)


def _is_open(scope: Scope, protect_metrics: bool, docs_path: str) -> bool:
    if scope.get("method") == "OPTIONS":  # Litestar's automatic answer (Allow) says nothing private
        return True
    handler = scope.get("route_handler")
    if handler is not None and _opted_out(handler.opt, protect_metrics):
        return True
    path: str = scope.get("path", "")
    return path == docs_path or path.startswith(docs_path + "/")


def _error_body(message: str) -> bytes:
    error = OpenAIError(message=message, type="invalid_request_error", code="invalid_api_key")
    return msgspec.json.encode(OpenAIErrorResponse(error))


class RequireApiKey:
    """ASGI middleware: ``DefineMiddleware(RequireApiKey, keys=..., protect_metrics=...)``.

    A request to a protected route without a valid key gets 401, an OpenAI-style error body
    and ``WWW-Authenticate: Bearer``; it never reaches the route.
    """

    def __init__(self, app: ASGIApp, keys: ApiKeys, protect_metrics: bool = False, docs_path: str = "/schema") -> None:
        self.app = app
        self.keys = keys
        self.protect_metrics = protect_metrics
        self.docs_path = docs_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or _is_open(scope, self.protect_metrics, self.docs_path):
            await self.app(scope, receive, send)
            return
        authorization = next((v for k, v in scope.get("headers", []) if k == b"authorization"), None)
        refusal = self.keys.check(authorization)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        challenge = _CHALLENGE if refusal == MISSING else _CHALLENGE + ', error="invalid_token"'
        body = _error_body(refusal)
        headers: list[tuple[bytes, bytes]] = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", challenge.encode()),
        ]
        start: HTTPResponseStartEvent = {"type": "http.response.start", "status": 401, "headers": headers}
        await send(start)
        end: HTTPResponseBodyEvent = {
            "type": "http.response.body",
            "body": b"" if scope.get("method") == "HEAD" else body,
            "more_body": False,
        }
        await send(end)


def document_api_keys(app: Litestar, protect_metrics: bool) -> None:
    """Adds the bearer security scheme to ``app``'s OpenAPI document: required on every
    protected operation (with its 401 answer), absent on the open ones."""
    schema = app.openapi_schema
    components = schema.components if isinstance(schema.components, Components) else Components()
    components.security_schemes = {
        **(components.security_schemes or {}),
        SECURITY_SCHEME: SecurityScheme(
            type="http",
            scheme="bearer",
            description="An API key of the server (--api-key, --api-key-file or KAEL_API_KEY).",
        ),
    }
    schema.components = components
    schema.security = [{SECURITY_SCHEME: []}]
    unauthorized = OpenAPIResponse(
        description="Missing or invalid API key",
        content={"application/json": OpenAPIMediaType(schema=_schema_of_error())},
    )
    handlers = {
        (route.path, method.lower()): handler
        for route in app.routes
        for handler in getattr(route, "route_handlers", ())
        for method in getattr(handler, "http_methods", ())
    }
    for path, item in (schema.paths or {}).items():
        for method in ("get", "put", "post", "delete", "options", "head", "patch", "trace"):
            operation = getattr(item, method, None)
            handler = handlers.get((path, method))
            if operation is None or handler is None:
                continue
            if _opted_out(handler.opt, protect_metrics):
                operation.security = []
            elif operation.responses is not None:
                operation.responses = {**operation.responses, "401": unauthorized}


def _schema_of_error() -> Schema:
    # Litestar writes a plain dict in the document verbatim (as kael_server.openapi does).
    return schema_of(OpenAIErrorResponse)  # type: ignore[return-value]
