"""``--request-timeout``: a generation past its deadline ends (504, or a stream's final error
event), its slot is freed at once, and the metrics count it under the outcome ``timeout``.

The fake model is held by a Gate, so a test decides when tokens come: the deadline passes
while the worker waits for the gate, and the next token sees the cancellation.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time

import pytest
from kael_server.batching import BatchScheduler
from kael_server.config import ServerConfig
from kael_server.deadline import MAX_REQUEST_TIMEOUT, arm, check_request_timeout
from kael_server.errors import Cancelled, ServerConfigError
from kael_server.jobs import Finished, Job, SamplingParams
from litestar import Litestar
from litestar.testing import TestClient

from kael_server import Generator, create_app, deadline

from .asgi import Exchange
from .conftest import generator_of, poll_until, samples
from .fake_batch_engine import FakeBatchEngine
from .fakes import ByteTokenizer, FakeModel, Gate

TIMEOUT = 0.2
"""Seconds; each test waits for the cancellation itself, never for a fixed time."""
ROOMY = 5.0
"""A deadline no request of a few fake tokens comes near."""


def single_slot_app(model: FakeModel, timeout: float | None = TIMEOUT) -> Litestar:
    return create_app(Generator(model, ByteTokenizer(), make_rng=random.Random), ServerConfig(request_timeout=timeout))


def batch_app(engine: FakeBatchEngine, timeout: float = TIMEOUT) -> Litestar:
    generator = Generator(
        FakeModel(),
        ByteTokenizer(),
        make_rng=random.Random,
        make_scheduler=lambda g: BatchScheduler(g, engine, queue=2, queue_timeout=30),
    )
    return create_app(generator, ServerConfig(request_timeout=timeout))


def timeouts(app: Litestar) -> float:
    return samples(generator_of(app).metrics.render().decode())[("kael_requests_total", (("status", "timeout"),))]


async def cancelled_by_timeout(app: Litestar, n: int = 1) -> None:
    """Waits until ``n`` running jobs have been cancelled by the deadline."""

    def cancelled() -> bool:
        jobs = generator_of(app).scheduler.running()
        return sum(job.cancel_reason == "timeout" for job in jobs) >= n

    assert await asyncio.to_thread(poll_until, cancelled)


@pytest.mark.anyio
async def test_plain_request_past_the_deadline_is_504_and_its_slot_is_freed() -> None:
    gate = Gate(allowed=3)
    model = FakeModel(gate=gate)
    app = single_slot_app(model)
    started = time.perf_counter()
    exchange = Exchange(app, "/generate", {"prompt": "a", "max_tokens": 100}).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 4)  # 3 tokens made, the 4th is held
    await cancelled_by_timeout(app)
    assert time.perf_counter() - started >= TIMEOUT  # not before its deadline
    gate.open()
    await exchange.finish()
    assert exchange.status == 504
    body = json.loads(exchange.received)
    assert body["detail"] == Cancelled("timeout").message and "--request-timeout" in body["detail"]
    assert len(model.calls[0].produced) == 4  # the next token saw the cancellation
    assert generator_of(app).scheduler.running() == []  # the slot is free
    assert timeouts(app) == 1
    model.gate = None
    after = Exchange(app, "/generate", {"prompt": "b", "max_tokens": 2}).start()
    await after.finish()
    assert after.status == 200  # not 429: nothing holds the slot
    assert timeouts(app) == 1


@pytest.mark.anyio
async def test_stream_past_the_deadline_ends_with_an_error_event() -> None:
    gate = Gate(allowed=2)
    app = single_slot_app(FakeModel(gate=gate))
    stream = Exchange(app, "/generate", {"prompt": "a", "max_tokens": 100, "stream": True}).start()
    await stream.wait_until(lambda e: len(e.events()) == 2)
    await cancelled_by_timeout(app)
    gate.open()
    await stream.finish()
    assert stream.status == 200  # the stream had started
    events = stream.events()
    assert [set(json.loads(e)) for e in events[:2]] == [{"text"}, {"text"}]
    assert events[2:] == [json.dumps({"error": Cancelled("timeout").message}, separators=(",", ":")), "[DONE]"]
    assert timeouts(app) == 1


@pytest.mark.anyio
async def test_openai_route_answers_504_as_a_server_error() -> None:
    gate = Gate(allowed=1)
    app = single_slot_app(FakeModel(gate=gate))
    exchange = Exchange(app, "/v1/completions", {"prompt": "a", "max_tokens": 50}).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 2)
    await cancelled_by_timeout(app)
    gate.open()
    await exchange.finish()
    assert exchange.status == 504
    error = json.loads(exchange.received)["error"]
    assert (error["type"], error["message"]) == ("server_error", Cancelled("timeout").message)
    assert timeouts(app) == 1


@pytest.mark.anyio
async def test_batched_job_past_the_deadline_leaves_its_row_and_the_others_go_on() -> None:
    gate = Gate(allowed=0)
    engine = FakeBatchEngine(2, gate=gate)
    app = batch_app(engine, timeout=ROOMY)
    slow = Exchange(app, "/generate", {"prompt": "a", "max_tokens": 100, "temperature": 0}).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 1)  # the worker holds before step 0
    (job,) = generator_of(app).scheduler.running()
    deadline.arm(job, TIMEOUT)  # this job's own, shorter deadline (the route armed ROOMY)
    await cancelled_by_timeout(app)
    other = Exchange(app, "/generate", {"prompt": "b", "max_tokens": 5, "temperature": 0}).start()
    gate.open()
    await slow.finish()
    await other.finish()
    assert slow.status == 504
    assert other.status == 200 and json.loads(other.received)["tokens"] == 5
    assert len(engine.released) == 2 and engine.contexts == {}  # each job gave its row back
    assert generator_of(app).scheduler.running() == []
    assert timeouts(app) == 1


@pytest.mark.anyio
async def test_queued_job_past_the_deadline_gives_its_place_back() -> None:
    gate = Gate(allowed=0)
    engine = FakeBatchEngine(1, gate=gate)
    app = batch_app(engine, timeout=TIMEOUT)
    running = Exchange(app, "/generate", {"prompt": "a", "max_tokens": 3, "temperature": 0}).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 1)
    queued = Exchange(app, "/generate", {"prompt": "b", "max_tokens": 3, "temperature": 0}).start()
    await cancelled_by_timeout(app, 2)  # the running job and the queued one
    gate.open()
    for exchange in (running, queued):
        await exchange.finish()
    assert (running.status, queued.status) == (504, 504)
    assert generator_of(app).scheduler.running() == []
    assert timeouts(app) == 2


@pytest.mark.anyio
async def test_a_request_that_finishes_in_time_is_not_touched() -> None:
    app = single_slot_app(FakeModel(), timeout=30)
    exchange = Exchange(app, "/generate", {"prompt": "a", "max_tokens": 8}).start()
    await exchange.finish()
    assert exchange.status == 200 and json.loads(exchange.received)["tokens"] == 8
    assert timeouts(app) == 0


@pytest.mark.anyio
async def test_a_job_done_before_its_deadline_is_never_cancelled() -> None:
    loop = asyncio.get_running_loop()
    job = Job("p", SamplingParams(max_tokens=1, temperature=0, top_k=0), time.perf_counter() - 10, loop)
    arm(job, 1)  # already past: the timer fires on the next loop iteration
    job.done.set_result(Finished(""))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not job.cancelled


@pytest.mark.anyio
async def test_a_deadline_already_past_cancels_at_once() -> None:
    loop = asyncio.get_running_loop()
    job = Job("p", SamplingParams(max_tokens=1, temperature=0, top_k=0), time.perf_counter() - 10, loop)
    arm(job, 1)
    await asyncio.sleep(0)  # call_later(0) runs on the next iteration
    await asyncio.sleep(0)
    assert job.cancel_reason == "timeout"


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), MAX_REQUEST_TIMEOUT + 1, True, "5"])
def test_bad_timeouts_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="request timeout"):
        check_request_timeout(bad)  # type: ignore[arg-type]
    with pytest.raises(ServerConfigError, match="--request-timeout: the request timeout"):
        single_slot_app(FakeModel(), timeout=bad)  # type: ignore[arg-type]


def test_good_timeouts_are_kept() -> None:
    assert check_request_timeout(None) is None
    assert check_request_timeout(2) == 2.0
    assert check_request_timeout(MAX_REQUEST_TIMEOUT) == MAX_REQUEST_TIMEOUT


def test_cli_refuses_a_bad_timeout_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kael_server.cli", "--request-timeout", "0"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("kael-server:")]
    assert "--request-timeout" in line and "more than 0" in line
    assert "Traceback" not in done.stderr


def test_the_openapi_document_has_the_504_only_with_a_deadline() -> None:
    with TestClient(single_slot_app(FakeModel(), timeout=5)) as client:
        paths = client.get("/schema/openapi.json").json()["paths"]
    for path in ("/generate", "/v1/completions"):
        responses = paths[path]["post"]["responses"]
        assert responses["504"]["content"] == responses["500"]["content"]
        assert responses["504"]["description"] == "The generation ran past --request-timeout"
    assert "504" not in paths["/tokenize"]["post"]["responses"]
    with TestClient(single_slot_app(FakeModel(), timeout=None)) as client:
        paths = client.get("/schema/openapi.json").json()["paths"]
    assert "504" not in paths["/generate"]["post"]["responses"]
