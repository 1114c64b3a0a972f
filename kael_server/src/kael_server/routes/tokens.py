"""``POST /tokenize`` and ``POST /detokenize``: the tokenizer, run on a worker thread."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from litestar import Request, Response, post

from kael_server import limits
from kael_server.accounting import record_of
from kael_server.errors import FieldError, InvalidRequest, client_error
from kael_server.openapi import JSON, documented
from kael_server.replies import DetokenizeResponse, TokenizeResponse
from kael_server.routes.generate import error_response
from kael_server.schemas import DetokenizeRequest, ErrorResponse, TokenizeRequest
from kael_server.state import ServerState
from kael_server.validation import decode, read_body

__all__ = ["detokenize", "tokenize"]

_ERRORS: dict[int, dict[str, Any]] = {status: {JSON: ErrorResponse} for status in (413, 422, 500, 503)}


@post(
    "/tokenize",
    status_code=200,
    operation_class=documented({200: {JSON: TokenizeResponse}, **_ERRORS}, body=TokenizeRequest),
    summary="Token ids of a text",
)
async def tokenize(request: Request[Any, Any, Any], server: ServerState) -> Response[Any]:
    try:
        body = decode(await read_body(request, limits.MAX_BODY_BYTES), TokenizeRequest)
        generator = server.require()
        ids = await anyio.to_thread.run_sync(generator.tokenizer.encode, body.prompt)
        return Response(TokenizeResponse(tokens=ids, count=len(ids), max_model_len=generator.context_length))
    except Exception as exc:
        return _failure(request, exc)


@post(
    "/detokenize",
    status_code=200,
    operation_class=documented({200: {JSON: DetokenizeResponse}, **_ERRORS}, body=DetokenizeRequest),
    summary="Text of token ids (invalid UTF-8 becomes U+FFFD)",
)
async def detokenize(request: Request[Any, Any, Any], server: ServerState) -> Response[Any]:
    try:
        body = decode(await read_body(request, limits.MAX_BODY_BYTES), DetokenizeRequest)
        generator = server.require()
        if any(t >= generator.vocab_size for t in body.tokens):
            raise InvalidRequest(
                [FieldError("tokens", f"expected ids below the vocabulary size {generator.vocab_size}")]
            )
        data = await anyio.to_thread.run_sync(generator.tokenizer.decode, body.tokens)
        return Response(DetokenizeResponse(prompt=data.decode("utf-8", errors="replace")))
    except Exception as exc:
        return _failure(request, exc)


def _failure(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    return error_response(client_error(exc, record_of(request).request_id, "tokenizer failed"))
