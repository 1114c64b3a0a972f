"""The playground page in a real browser: headless Chromium (Debian's) driven by Playwright.

No browser is downloaded: the executable comes from KAEL_CHROMIUM or the usual system
paths, and the tests skip when Playwright or Chromium is absent (.ci/run installs both).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .processes import free_port, server_process

pytestmark = pytest.mark.e2e
HERE = Path(__file__).parent


def _chromium() -> str:
    for candidate in (
        os.environ.get("KAEL_CHROMIUM"),
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
        shutil.which("google-chrome"),
    ):
        if candidate and os.path.exists(candidate):
            return candidate
    pytest.skip("no Chromium executable found (apt-get install chromium)")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    sync_api = pytest.importorskip("playwright.sync_api")
    executable = _chromium()
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def slow_server() -> Iterator[str]:
    port = free_port()
    with server_process([sys.executable, str(HERE / "fake_server.py"), str(port)], port):
        yield f"http://127.0.0.1:{port}"


def _cancelled(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith('kael_requests_total{status="cancelled"}'):
            return float(line.split()[-1])
    return 0.0


def test_type_prompt_see_stream_press_stop(browser: object, slow_server: str) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        page.goto(slow_server + "/")
        assert page.title() == "kael playground"
        page.fill("#prompt", "hello kael")
        page.fill("#max_tokens", "400")
        page.fill("#temperature", "0")
        page.click("#generate")
        # text streams in piece by piece
        page.wait_for_function("document.getElementById('generated').textContent.length >= 5", timeout=20000)
        assert page.is_enabled("#stop") and page.is_disabled("#generate")
        assert "tokens/s" in page.text_content("#stats")
        page.click("#stop")
        page.wait_for_function("document.getElementById('message').textContent === 'Stopped.'", timeout=10000)
        shown = len(page.text_content("#generated"))
        assert 5 <= shown < 400
        assert page.is_enabled("#generate")
        # the server saw the client leave and counted the request as cancelled
        deadline_ok = False
        for _ in range(100):
            if _cancelled(slow_server) >= 1:
                deadline_ok = True
                break
            page.wait_for_timeout(50)
        assert deadline_ok
    finally:
        page.close()


def test_invalid_settings_show_a_clear_message(browser: object, slow_server: str) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        page.goto(slow_server + "/")
        page.fill("#prompt", "hi")
        page.fill("#temperature", "0.00001")
        page.click("#generate")
        page.wait_for_function("document.getElementById('message').textContent.length > 0", timeout=10000)
        assert page.text_content("#message").startswith("Invalid request")
        assert page.text_content("#generated") == ""
    finally:
        page.close()


def test_real_model_streams_to_the_page(browser: object, tmp_path: Path) -> None:
    kael = pytest.importorskip("kael")
    data = HERE.parent / "data"
    for name, folder in (
        ("config.json", "tiny-gpt2"),
        ("model.safetensors", "tiny-gpt2"),
        ("vocab.json", "gpt2-tokenizer"),
        ("merges.txt", "gpt2-tokenizer"),
    ):
        shutil.copyfile(data / folder / name, tmp_path / name)
    assert kael.GPT is not None
    port = free_port()
    cmd = [sys.executable, "-m", "kael_server.cli", "--data", str(tmp_path), "--port", str(port)]
    with server_process(cmd, port):
        page = browser.new_page()  # type: ignore[attr-defined]
        try:
            page.goto(f"http://127.0.0.1:{port}/")
            page.fill("#prompt", "Hello, my name is")
            page.fill("#max_tokens", "20")
            page.fill("#temperature", "0")
            page.click("#generate")
            page.wait_for_function(
                "!document.getElementById('generate').disabled && "
                "document.getElementById('generated').textContent.length > 0",
                timeout=30000,
            )
            text = page.text_content("#generated")
            plain = httpx.post(
                f"http://127.0.0.1:{port}/generate",
                json={"prompt": "Hello, my name is", "max_tokens": 20, "temperature": 0},
                timeout=60,
            ).json()
            assert text == plain["text"]
            assert page.text_content("#message") == ""
        finally:
            page.close()


BUNDLED = HERE.parents[1] / "kael_server" / "src" / "kael_server" / "models" / "kael-tiny"
PAGE_KEY = "playground-key-Mn8"


@pytest.fixture
def bundled_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """The real ``kael-server`` with no --data: the bundled kael-tiny, as a newcomer starts it
    (extra flags as the indirect parameter)."""
    pytest.importorskip("kael")
    import kael_server.loading

    try:
        kael_server.loading.bundled_model_dir()
    except kael_server.loading.ServerConfigError:
        pytest.skip("this installation has no bundled model")
    port = free_port()
    cmd = [sys.executable, "-m", "kael_server.cli", "--port", str(port), *getattr(request, "param", ())]
    with server_process(cmd, port):
        yield f"http://127.0.0.1:{port}"


def _wait_for_model_line(page: object) -> str:
    page.wait_for_function(  # type: ignore[attr-defined]
        "document.getElementById('model').textContent.includes('context')", timeout=30000
    )
    return str(page.text_content("#model"))  # type: ignore[attr-defined]


def _generate_and_wait(page: object) -> None:
    page.click("#generate")  # type: ignore[attr-defined]
    page.wait_for_function(  # type: ignore[attr-defined]
        "!document.getElementById('generate').disabled && "
        "(document.getElementById('generated') !== null) && "
        "(document.getElementById('generated').textContent.length > 0 || "
        "document.getElementById('message').textContent.length > 0)",
        timeout=60000,
    )


def test_the_defaults_fit_the_bundled_model(browser: object, bundled_server: str) -> None:
    card = httpx.get(f"{bundled_server}/v1/models").json()["data"][0]
    context = card["max_model_len"]
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        page.goto(bundled_server + "/")
        assert _wait_for_model_line(page) == f"model {card['id']} · context {context} tokens"
        max_tokens = int(page.input_value("#max_tokens"))
        assert int(page.get_attribute("#max_tokens", "max")) == min(512, context - 1)
        prompt = page.input_value("#prompt")
        prompt_tokens = httpx.post(f"{bundled_server}/tokenize", json={"prompt": prompt}).json()["count"]
        assert prompt_tokens + max_tokens <= context  # the first click fits the model
        _generate_and_wait(page)  # nothing changed: the newcomer's first click
        assert page.text_content("#message") == ""
        assert len(page.text_content("#generated")) > 0
        assert "tokens/s" in page.text_content("#stats")
    finally:
        page.close()


def test_a_prompt_that_does_not_fit_shows_the_servers_reason(browser: object, bundled_server: str) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        page.goto(bundled_server + "/")
        _wait_for_model_line(page)
        page.fill("#prompt", "x = 1\n" * 40)  # bytes are tokens: 240 of kael-tiny's 128
        _generate_and_wait(page)
        message = page.text_content("#message")
        assert message.startswith("Too long: prompt (240 tokens) plus max_tokens")
        assert "exceeds the context of 128 tokens" in message
    finally:
        page.close()


@pytest.mark.parametrize("bundled_server", [["--api-key", PAGE_KEY]], indirect=True)
def test_the_page_asks_for_the_key_and_sends_it(browser: object, bundled_server: str) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        page.goto(bundled_server + "/")  # the page itself needs no key
        page.wait_for_selector("#auth", state="visible", timeout=30000)  # /v1/models said 401
        assert page.text_content("#auth_reason") == "This server needs an API key."
        page.fill("#api_key", "not-the-key")
        page.click("#save_key")
        page.wait_for_function(
            "document.getElementById('auth_reason').textContent.startsWith('The server did not accept')",
            timeout=30000,
        )
        assert page.is_visible("#auth")
        page.fill("#api_key", PAGE_KEY)
        page.press("#api_key", "Enter")
        assert "context" in _wait_for_model_line(page)  # /v1/models answered with the key
        assert page.is_hidden("#auth")
        assert page.evaluate("sessionStorage.getItem('kael-api-key')") == PAGE_KEY
        _generate_and_wait(page)
        assert page.text_content("#message") == ""
        assert len(page.text_content("#generated")) > 0
        page.reload()  # the key stays for this tab's session
        _wait_for_model_line(page)
        assert page.is_hidden("#auth")
    finally:
        page.close()
    fresh = browser.new_page()  # type: ignore[attr-defined]
    try:  # another tab (another session) is asked again
        fresh.goto(bundled_server + "/")
        fresh.wait_for_selector("#auth", state="visible", timeout=30000)
    finally:
        fresh.close()


def _models_body(card: dict[str, object]) -> str:
    return json.dumps({"object": "list", "data": [card]})


def test_a_models_answer_without_max_model_len_keeps_the_defaults(browser: object, slow_server: str) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        page.route(
            "**/v1/models",
            lambda route: route.fulfill(
                status=200, content_type="application/json", body=_models_body({"id": "other", "object": "model"})
            ),
        )
        page.goto(slow_server + "/")
        page.wait_for_function("document.getElementById('model').textContent === 'model other'", timeout=10000)
        assert page.input_value("#max_tokens") == "128"
        assert page.get_attribute("#max_tokens", "max") == "512"
    finally:
        page.close()


def test_a_loading_server_is_asked_again_until_it_says_its_context(browser: object, slow_server: str) -> None:
    calls: list[int] = []

    def answer(route: object) -> None:
        calls.append(1)
        if len(calls) < 3:  # the model is still loading
            route.fulfill(status=503, content_type="application/json", body='{"error": {}}')  # type: ignore[attr-defined]
        else:
            card = {"id": "small", "object": "model", "max_model_len": 100}
            route.fulfill(status=200, content_type="application/json", body=_models_body(card))  # type: ignore[attr-defined]

    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        page.route("**/v1/models", answer)
        page.goto(slow_server + "/")
        assert _wait_for_model_line(page) == "model small · context 100 tokens"
        assert len(calls) == 3
        assert page.input_value("#max_tokens") == "50"  # half the context, leaving room for the prompt
        assert page.get_attribute("#max_tokens", "max") == "99"
    finally:
        page.close()
