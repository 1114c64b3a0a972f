"""Clients that leave stop their generation; shutdown stops it and ends streams; readiness."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from kael_server.metrics import Metrics
from litestar.testing import TestClient

from kael_server import Generator, create_app

from .asgi import Exchange
from .conftest import generator_of, make_app, poll_until, samples
from .fakes import ByteTokenizer, FakeModel, Gate


@pytest.mark.anyio
async def test_plain_client_that_disconnects_is_answered_499_without_waiting_for_a_token() -> None:
    gate = Gate(allowed=3)
    model = FakeModel(gate=gate)
    app = make_app(model)
    exchange = Exchange(app, "/generate", {"prompt": "a", "max_tokens": 100}).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 4)  # 3 tokens made, the 4th is blocked
    exchange.disconnect()
    # The answer comes while the model is still blocked: detection does not wait for a token.
    await exchange.finish(timeout=5)
    assert exchange.status == 499
    assert len(model.calls[0].produced) == 3
    gate.open()
    assert await asyncio.to_thread(generator_of(app).scheduler.wait_idle, 10)
    # The next token saw the cancellation and stopped generation there.
    assert len(model.calls[0].produced) == 4
    metrics = samples(generator_of(app).metrics.render().decode())
    assert metrics[("kael_requests_total", (("status", "cancelled"),))] == 1
    assert metrics[("kael_requests_in_flight", ())] == 0


@pytest.mark.anyio
async def test_streaming_client_that_disconnects_stops_generation_at_the_next_token() -> None:
    gate = Gate(allowed=2)
    model = FakeModel(gate=gate)
    app = make_app(model)
    stream = Exchange(app, "/generate", {"prompt": "a", "max_tokens": 100, "stream": True}).start()
    await stream.wait_until(lambda e: len(e.events()) == 2)
    # the third token is in flight (its step waits at the gate) when the client goes: without
    # this wait, a slow worker may see the cancel before it starts the third step (2 tokens)
    assert await asyncio.to_thread(gate.wait_arrivals, 3)
    stream.disconnect()
    await stream.finish()
    gate.open()
    assert await asyncio.to_thread(generator_of(app).scheduler.wait_idle, 10)
    assert len(model.calls[0].produced) == 3  # the one in flight, then no more
    metrics = samples(generator_of(app).metrics.render().decode())
    assert metrics[("kael_requests_total", (("status", "cancelled"),))] == 1
    assert metrics[("kael_requests_total", (("status", "ok"),))] == 0


@pytest.mark.anyio
async def test_shutdown_stops_the_running_generation_and_ends_open_streams() -> None:
    gate = Gate(allowed=2)
    model = FakeModel(gate=gate)
    app = make_app(model)
    server = app.state.server
    stream = Exchange(app, "/generate", {"prompt": "a", "max_tokens": 100, "stream": True}).start()
    await stream.wait_until(lambda e: len(e.events()) == 2)
    # the third token is in flight (its step waits at the gate) when the shutdown starts: without
    # this wait, a slow worker may see the cancel before it starts the third step (2 tokens)
    assert await asyncio.to_thread(gate.wait_arrivals, 3)
    (job,) = generator_of(app).scheduler.running()
    shutdown = asyncio.create_task(server.shutdown())
    await asyncio.sleep(0)  # one loop turn: shutdown runs up to its wait for the slot
    assert job.cancelled and job.cancel_reason == "shutdown"
    gate.open()
    await shutdown
    await stream.finish()
    events = stream.events()
    assert [json.loads(e) for e in events[:2]] == [{"text": chr(c)} for c in model.calls[0].produced[:2]]
    assert events[2:] == ['{"error":"server shutting down"}', "[DONE]"]
    assert len(model.calls[0].produced) == 3  # stopped at the next token
    assert not generator_of(app).scheduler.running()
    late = Exchange(app, "/generate", {"prompt": "b"}).start()
    await late.finish()
    assert late.status == 503


def test_ready_is_503_while_draining() -> None:
    app = make_app()
    with TestClient(app) as client:
        assert client.get("/ready").json() == {"status": "ready"}
        app.state.server.begin_drain()
        ready = client.get("/ready")
        assert (ready.status_code, ready.json()) == (503, {"status": "draining"})
        assert client.get("/health").json() == {"status": "ok"}
        assert client.post("/generate", json={"prompt": "a"}).status_code == 503


def test_ready_is_503_while_loading_then_200() -> None:
    loaded = threading.Event()

    def loader(metrics: Metrics) -> Generator:
        assert loaded.wait(10)
        return Generator(FakeModel(), ByteTokenizer(), metrics=metrics)

    with TestClient(create_app(loader)) as client:
        ready = client.get("/ready")
        assert (ready.status_code, ready.json()) == (503, {"status": "loading"})
        assert client.get("/health").status_code == 200
        assert client.post("/generate", json={"prompt": "a"}).status_code == 503
        assert client.get("/metrics").status_code == 200
        loaded.set()
        assert poll_until(lambda: client.get("/ready").status_code == 200)
        assert client.post("/generate", json={"prompt": "a", "max_tokens": 2}).status_code == 200


def test_load_failure_is_reported() -> None:
    failures: list[BaseException] = []
    reported = threading.Event()

    def loader(metrics: Metrics) -> Generator:
        raise OSError("disk on fire")

    def on_error(exc: BaseException) -> None:
        failures.append(exc)
        reported.set()

    with TestClient(create_app(loader, on_load_error=on_error)) as client:
        assert reported.wait(10)
        ready = client.get("/ready")
        assert (ready.status_code, ready.json()) == (503, {"status": "failed"})
        assert isinstance(failures[0], OSError)
