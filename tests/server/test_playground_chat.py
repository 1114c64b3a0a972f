"""The playground's chat in a real browser (headless Chromium via Playwright, as
test_playground_browser.py) against a real ``kael-server --data kael-tiny-chat``: the chat shows
only for a model with a chat template; a reply streams in and equals the server's greedy
answer to the same conversation (the oracle: a plain request), a second turn carries the
history, Clear empties it; the JSON-schema box sets ``response_format`` so the reply parses
and validates (``jsonschema``), and a schema the server refuses shows its reason."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import httpx
import jsonschema
import pytest

from .processes import free_port, server_process
from .test_playground_browser import browser  # noqa: F401 - the fixture

pytestmark = pytest.mark.e2e
SCHEMA = {
    "type": "object",
    "properties": {"mood": {"enum": ["happy", "sad"]}, "score": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["mood", "score"],
    "additionalProperties": False,
}


def _server(*args: str) -> Iterator[str]:
    pytest.importorskip("kael")
    port = free_port()
    with server_process([sys.executable, "-m", "kael_server.cli", "--port", str(port), *args], port):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def chat_server() -> Iterator[str]:
    yield from _server("--data", "kael-tiny-chat")


@pytest.fixture(scope="module")
def plain_server() -> Iterator[str]:
    yield from _server()


def _greedy(url: str, messages: list[dict[str, str]], max_tokens: int, **extra: object) -> str:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
    return str(
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]["content"]
    )


def _send_and_wait(page: object, text: str) -> str:
    page.fill("#chat_input", text)  # type: ignore[attr-defined]
    page.click("#send")  # type: ignore[attr-defined]
    page.wait_for_function(  # type: ignore[attr-defined]
        "!document.getElementById('send').disabled && document.querySelectorAll('.turn.assistant').length > 0",
        timeout=60000,
    )
    return str(page.evaluate("[...document.querySelectorAll('.turn.assistant .text')].pop().textContent"))  # type: ignore[attr-defined]


def _open(chromium: object, url: str) -> object:
    page = chromium.new_page()  # type: ignore[attr-defined]
    page.goto(url + "/")
    page.wait_for_selector("#chat", state="visible", timeout=30000)
    page.fill("#chat_temperature", "0")
    page.fill("#chat_max_tokens", "24")
    return page


def test_a_chat_streams_the_greedy_reply_keeps_the_history_and_clears(browser: object, chat_server: str) -> None:  # noqa: F811
    page = _open(browser, chat_server)
    try:
        page.fill("#system", "Be brief.")  # type: ignore[attr-defined]
        first = _send_and_wait(page, "Hello!")
        turn1 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
        assert first == _greedy(chat_server, turn1, 24) and first
        second = _send_and_wait(page, "And again?")
        turn2 = [*turn1, {"role": "assistant", "content": first}, {"role": "user", "content": "And again?"}]
        assert second == _greedy(chat_server, turn2, 24)
        assert page.evaluate("document.querySelectorAll('.turn').length") == 4  # type: ignore[attr-defined]
        page.click("#clear")  # type: ignore[attr-defined]
        assert page.evaluate("document.querySelectorAll('.turn').length") == 0  # type: ignore[attr-defined]
        third = _send_and_wait(page, "Hello!")
        assert third == first  # a fresh conversation (the system prompt kept)
    finally:
        page.close()  # type: ignore[attr-defined]


def test_the_schema_box_makes_replies_json_that_validates(browser: object, chat_server: str) -> None:  # noqa: F811
    page = _open(browser, chat_server)
    try:
        page.fill("#chat_max_tokens", "60")  # type: ignore[attr-defined]
        page.evaluate("document.querySelector('details').open = true")  # type: ignore[attr-defined]
        page.fill("#schema", json.dumps(SCHEMA))  # type: ignore[attr-defined]
        reply = _send_and_wait(page, "How do you feel?")
        jsonschema.validate(json.loads(reply), SCHEMA)
        want = _greedy(
            chat_server,
            [{"role": "user", "content": "How do you feel?"}],
            60,
            response_format={"type": "json_schema", "json_schema": {"name": "playground", "schema": SCHEMA}},
        )
        assert reply == want
        page.click("#clear")  # type: ignore[attr-defined]
        page.fill("#schema", '{"type": "bogus"}')  # type: ignore[attr-defined]
        page.fill("#chat_input", "Hi")  # type: ignore[attr-defined]
        page.click("#send")  # type: ignore[attr-defined]
        page.wait_for_function(  # type: ignore[attr-defined]
            "document.getElementById('chat_message').textContent.length > 0", timeout=30000
        )
        message = page.text_content("#chat_message")  # type: ignore[attr-defined]
        assert message.startswith("The server refused: response_format.json_schema.schema: invalid json schema")
    finally:
        page.close()  # type: ignore[attr-defined]


def test_no_chat_for_a_model_without_a_chat_template(browser: object, plain_server: str) -> None:  # noqa: F811
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        page.goto(plain_server + "/")
        page.wait_for_function("document.getElementById('model').textContent.includes('context')", timeout=30000)
        assert page.is_hidden("#chat")
    finally:
        page.close()
