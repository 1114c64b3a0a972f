"""Fuzz target: kael-server's request parsing and validation on arbitrary bodies.

Each input is a request body. It is read through `validation.read_body` (the capped,
chunked reader, fed by a fake ASGI receive in two chunks) and decoded by
`validation.decode` against every request schema (`/generate`, `/v1/completions`,
`/v1/chat/completions`, `/tokenize`, `/detokenize`); each refusal is turned into the error
answer of both API styles. An accepted OpenAI request goes on through what its route does
before any model runs: the chat messages (`chat.conversation`), the tools (`chat_tools.
tool_request`: `tools`, `tool_choice`, `parallel_tool_calls`, and the tool-call grammar) and
the one constraint (`structured.constraint_of`: `response_format`, `structured_outputs`,
`guided_*`, `json_schema`, `grammar`, with their limits). Allowed outcomes: a valid body, or a
`ServerError` whose status is 4xx, whose field names come from the schema, and whose answers
are 4xx. A finding is anything else: another exception, a 5xx, an error echoing the input, or
a body accepted by kael that msgspec's own typed decoding of the same schema refuses or reads
differently.
"""

from __future__ import annotations

import json
from typing import Any

import _harness
import msgspec

with _harness.instrumented(__name__ == "__main__", ["kael_server"]):
    from kael_server.chat import conversation
    from kael_server.chat_schemas import ChatCompletionRequest
    from kael_server.chat_tools import tool_request
    from kael_server.errors import InvalidRequest, ServerError
    from kael_server.limits import MAX_BODY_BYTES, MAX_STOP_CHARS, MAX_STOP_STRINGS, temperature_ok
    from kael_server.routes.generate import error_response as generate_error_response
    from kael_server.routes.openai import error_response as openai_error_response
    from kael_server.schemas import CompletionRequest, DetokenizeRequest, GenerateRequest, TokenizeRequest
    from kael_server.structured import constraint_of
    from kael_server.validation import decode, read_body

SCHEMAS: tuple[type[msgspec.Struct], ...] = (
    GenerateRequest,
    CompletionRequest,
    ChatCompletionRequest,
    TokenizeRequest,
    DetokenizeRequest,
)


class _FakeRequest:
    """Just what read_body uses: headers and an ASGI receive that hands out the body in chunks."""

    def __init__(self, body: bytes) -> None:
        half = len(body) // 2
        self.headers = {"content-length": str(len(body))}
        self._messages: list[dict[str, Any]] = [
            {"type": "http.request", "body": body[:half], "more_body": True},
            {"type": "http.request", "body": body[half:], "more_body": False},
        ]

    async def receive(self) -> dict[str, Any]:
        return self._messages.pop(0)


def _run(coro: Any) -> Any:
    """Run a coroutine that never suspends (the fake receive returns at once)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("read_body suspended on a receive that never blocks")


def _check_refusal(error: ServerError, body: bytes) -> None:
    if not 400 <= error.status_code < 500:
        raise AssertionError(f"a bad body got status {error.status_code}: {error.message!r}")
    for respond in (generate_error_response, openai_error_response):
        status = respond(error).status_code
        if status is None or not 400 <= status < 500:
            raise AssertionError(f"{respond.__module__}.error_response answered {status}")
    if isinstance(error, InvalidRequest):
        if not error.errors:
            raise AssertionError("InvalidRequest without a field error")
        for field in error.errors:
            if len(body) >= 8 and body.decode("utf-8", "replace") in field.msg:
                raise AssertionError(f"error message repeats the body: {field.msg!r}")


def _has_duplicate_keys(body: bytes) -> bool:
    """Whether some JSON object in `body` repeats a key (the last one wins, as in most servers)."""
    seen_duplicate = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal seen_duplicate
        seen_duplicate |= len({k for k, _ in items}) != len(items)
        return dict(items)

    try:
        json.loads(body, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return False
    return seen_duplicate


def _check_accepted(value: msgspec.Struct, schema: type[msgspec.Struct], body: bytes) -> None:
    temperature = getattr(value, "temperature", None)  # null in a CompletionRequest: the default
    if isinstance(value, (GenerateRequest, CompletionRequest, ChatCompletionRequest)) and temperature is not None:
        if not temperature_ok(temperature):
            raise AssertionError(f"accepted temperature {temperature!r}")
    if isinstance(value, (CompletionRequest, ChatCompletionRequest)):
        stops = value.stop_strings()
        if len(stops) > MAX_STOP_STRINGS or not all(1 <= len(s) <= MAX_STOP_CHARS for s in stops):
            raise AssertionError(f"accepted stop strings {stops!r}")
    # A valid body re-encodes to a body that decodes to the same request.
    again = decode(msgspec.json.encode(value), schema)
    if again != value:
        raise AssertionError(f"re-encoded {value!r} decodes to {again!r}")
    # msgspec's typed decoding validates every occurrence of a repeated key; kael's decode,
    # like Python's json, keeps the last (RFC 8259 leaves it open): compare only without them.
    if _has_duplicate_keys(body):
        return
    try:
        typed = msgspec.json.decode(body, type=schema, strict=True)
    except msgspec.ValidationError as e:
        raise AssertionError(f"kael accepted a {schema.__name__} that msgspec refuses: {e}") from None
    if typed != value:
        raise AssertionError(f"kael read {value!r}, msgspec {typed!r}")


def _route_checks(value: msgspec.Struct, body: bytes) -> None:
    """What a route checks before generating (messages, tools, the constraint): a 4xx refusal or nothing."""
    try:
        extra, yields = None, False
        if isinstance(value, ChatCompletionRequest):
            conversation(value.messages)
            tools = tool_request(value.tools, value.tool_choice, value.parallel_tool_calls, None)
            extra, yields = tools.constraint, tools.auto
        constraint_of(value, extra, extra_yields=yields)
    except ServerError as error:
        _check_refusal(error, body)


def TestOneInput(data: bytes) -> None:
    try:
        body = _run(read_body(_FakeRequest(data), MAX_BODY_BYTES))  # type: ignore[arg-type]
    except ServerError as error:
        _check_refusal(error, data)
        return
    if body != data:
        raise AssertionError("read_body changed the body")
    for schema in SCHEMAS:
        try:
            value = decode(body, schema)
        except ServerError as error:
            _check_refusal(error, body)
        else:
            _check_accepted(value, schema, body)
            if isinstance(value, (CompletionRequest, ChatCompletionRequest)):
                _route_checks(value, body)


if __name__ == "__main__":
    _harness.fuzz(TestOneInput)
