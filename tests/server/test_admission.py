"""One generation slot: 429 while it is held, and every path that must give it back."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
from litestar.testing import TestClient

from .asgi import Exchange
from .conftest import generator_of, make_app, metric, sse_payloads
from .fakes import ByteTokenizer, FakeModel, Gate


def test_second_request_gets_429_at_once_then_recovers() -> None:
    gate = Gate()
    app = make_app(FakeModel(gate=gate))
    with TestClient(app) as client, ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.post, "/generate", json={"prompt": "a", "max_tokens": 3})
        assert gate.wait_arrivals(1)  # the first generation holds the slot
        busy = client.post("/generate", json={"prompt": "b", "max_tokens": 3})
        assert busy.status_code == 429
        assert busy.headers["retry-after"] == "1"
        openai_busy = client.post("/v1/completions", json={"prompt": "b"})
        assert openai_busy.status_code == 429
        assert openai_busy.json()["error"]["type"] == "rate_limit_error"
        gate.open()
        assert first.result(timeout=10).status_code == 200
        # The slot is released before the answer is sent: the next request is admitted at once.
        assert client.post("/generate", json={"prompt": "c", "max_tokens": 3}).status_code == 200
        assert metric(client, "kael_requests_total", status="busy") == 2
        assert metric(client, "kael_requests_total", status="ok") == 2


def test_slot_released_after_a_stream() -> None:
    with TestClient(make_app()) as client:
        for _ in range(3):
            response = client.post("/generate", json={"prompt": "a", "max_tokens": 4, "stream": True})
            assert sse_payloads(response.text)[-1] == "[DONE]"
        assert client.post("/generate", json={"prompt": "a", "max_tokens": 4}).status_code == 200


def test_slot_released_after_a_failure() -> None:
    model = FakeModel(fail_at=2)
    with TestClient(make_app(model)) as client:
        assert client.post("/generate", json={"prompt": "a", "max_tokens": 4}).status_code == 500
        model.fail_at = None
        assert client.post("/generate", json={"prompt": "a", "max_tokens": 4}).status_code == 200


def test_slot_released_after_a_tokenizer_failure() -> None:
    tokenizer = ByteTokenizer(fail=True)
    with TestClient(make_app(tokenizer=tokenizer)) as client:
        assert client.post("/generate", json={"prompt": "a"}).status_code == 500
        tokenizer.fail = False
        assert client.post("/generate", json={"prompt": "a", "max_tokens": 2}).status_code == 200


def test_slot_released_after_validation_failures() -> None:
    with TestClient(make_app(FakeModel(max_positions=16))) as client:
        assert client.post("/generate", json={"prompt": "a", "max_tokens": 99}).status_code == 413
        assert client.post("/generate", json={"prompt": "a", "top_k": -1}).status_code == 422
        assert client.post("/generate", json={"prompt": "a", "max_tokens": 2}).status_code == 200


@pytest.mark.anyio
async def test_client_that_never_reads_its_stream_cannot_keep_the_slot() -> None:
    model = FakeModel()
    app = make_app(model)
    generator = generator_of(app)
    stalled = Exchange(app, "/generate", {"prompt": "a", "max_tokens": 50, "stream": True}, reads=False)
    stalled.start()
    await stalled.wait_until(lambda e: e.status == 200)
    # The worker never waits for the reader: it finishes and gives the slot back.
    assert await asyncio.to_thread(generator.scheduler.wait_idle, 10)
    assert len(model.calls[0].produced) == 50
    nxt = Exchange(app, "/generate", {"prompt": "b", "max_tokens": 2}).start()
    await nxt.finish()
    assert nxt.status == 200
    stalled.disconnect()
    await stalled.finish()


@pytest.mark.anyio
async def test_slot_released_after_cancellation_while_encoding() -> None:
    gate = Gate()
    model = FakeModel()
    app = make_app(model, ByteTokenizer(gate=gate))
    generator = generator_of(app)
    leaving = Exchange(app, "/generate", {"prompt": "long prompt"}).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 1)  # encoding has started on the worker
    leaving.disconnect()
    await leaving.finish()
    assert leaving.status == 499
    assert generator.scheduler.running()  # still encoding: the worker owns the slot
    gate.open()
    assert await asyncio.to_thread(generator.scheduler.wait_idle, 10)
    assert model.calls == []  # cancelled before generating
    nxt = Exchange(app, "/generate", {"prompt": "b", "max_tokens": 2}).start()
    await nxt.finish()
    assert nxt.status == 200


def test_a_constrained_request_compiles_off_the_event_loop_and_429s_before_compiling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While one request's grammar compiles (held here on an event), the server answers other
    requests; when every slot is taken a constrained request is refused before any compile."""
    import threading

    import kael_server.structured as structured

    entered, release, compiles = threading.Event(), threading.Event(), []

    def slow_compile(*args: object) -> None:
        compiles.append(args)
        entered.set()
        assert release.wait(30)

    monkeypatch.setattr(structured, "check_compiles", slow_compile)
    gate = Gate()
    body = {"prompt": "a", "max_tokens": 2, "response_format": {"type": "json_object"}}
    with TestClient(make_app(FakeModel(gate=gate))) as client, ThreadPoolExecutor(2) as pool:
        first = pool.submit(client.post, "/v1/completions", json=body)
        assert entered.wait(30)  # compiling now, in a worker thread
        assert client.get("/health").status_code == 200
        assert client.get("/v1/models").status_code == 200
        release.set()
        assert gate.wait_arrivals(1)  # the first generation holds the slot
        busy = client.post("/v1/completions", json=body)
        assert busy.status_code == 429 and busy.json()["error"]["type"] == "rate_limit_error"
        assert len(compiles) == 1  # refused before compiling
        gate.open()
        assert first.result(timeout=30).status_code == 200
