"""Prometheus metrics after a known sequence of requests, checked sample by sample."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest
from kael_server.metrics import Metrics
from litestar.testing import TestClient
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kael_server import Generator, create_app

from .asgi import Exchange
from .conftest import generator_of, make_app, samples
from .fakes import ByteTokenizer, FakeModel, Gate


def vm_hwm_bytes() -> int:
    """Peak RSS as Linux reports it in /proc (an oracle independent of getrusage)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


async def post(app: object, path: str, payload: object) -> Exchange:
    exchange = Exchange(app, path, payload).start()
    await exchange.finish()
    return exchange


@pytest.mark.anyio
async def test_metrics_after_a_known_sequence() -> None:
    model = FakeModel(max_positions=32)
    app = make_app(model)
    generator = generator_of(app)
    before = vm_hwm_bytes() if sys.platform == "linux" else 0

    assert (await post(app, "/generate", {"prompt": "abc", "max_tokens": 5})).status == 200
    streamed = await post(app, "/generate", {"prompt": "de", "max_tokens": 4, "stream": True})
    assert streamed.events()[-1] == "[DONE]"

    model.gate = gate = Gate()
    held = Exchange(app, "/v1/completions", {"prompt": "f", "max_tokens": 2}).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 1)
    assert (await post(app, "/generate", {"prompt": "busy"})).status == 429
    gate.open()
    await held.finish()
    assert held.status == 200
    model.gate = None

    assert (await post(app, "/generate", {"prompt": "x", "max_tokens": 0})).status == 422
    assert (await post(app, "/generate", {"prompt": "x" * 30, "max_tokens": 3})).status == 413

    model.fail_at = 1
    assert (await post(app, "/generate", {"prompt": "gh", "max_tokens": 3})).status == 500
    model.fail_at = None

    model.gate = gate = Gate(allowed=2)
    leaving = Exchange(app, "/generate", {"prompt": "i", "max_tokens": 9}).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 3)
    leaving.disconnect()
    await leaving.finish()
    gate.open()
    assert await asyncio.to_thread(generator.scheduler.wait_idle, 10)

    m = samples(generator.metrics.render().decode())
    outcomes = ("ok", "busy", "rejected", "error", "cancelled")
    requests = {s: m[("kael_requests_total", (("status", s),))] for s in outcomes}
    assert requests == {"ok": 3, "busy": 1, "rejected": 2, "error": 1, "cancelled": 1}
    assert m[("kael_generated_tokens_total", ())] == 5 + 4 + 2 + 1 + 2
    assert m[("kael_prompt_tokens_total", ())] == 3 + 2 + 1 + 2 + 1  # refused prompts not counted
    assert m[("kael_requests_in_flight", ())] == 0
    assert m[("kael_request_seconds_count", ())] == 8
    buckets = sorted(float(dict(k[1])["le"]) for k in m if k[0] == "kael_request_seconds_bucket")
    assert buckets == [0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, float("inf")]
    assert m[("kael_time_to_first_token_seconds_count", ())] == 5  # every job that made a token
    assert m[("kael_tokens_per_second", ())] > 0
    if sys.platform == "linux":
        # The kernel's RSS counters are per-CPU approximations: the two reports agree closely.
        assert abs(m[("kael_peak_memory_bytes", ())] - vm_hwm_bytes()) < 4 * 2**20
        assert m[("kael_peak_memory_bytes", ())] > before / 2


def test_registries_are_per_app() -> None:
    first, second = make_app(), make_app()
    first_metrics = generator_of(first).metrics
    first_metrics.requests.labels("ok").inc()
    rendered = samples(generator_of(second).metrics.render().decode())
    assert rendered[("kael_requests_total", (("status", "ok"),))] == 0
    assert first_metrics.registry is not generator_of(second).metrics.registry


def test_content_type_names_one_charset_and_the_exposition_version() -> None:
    with TestClient(make_app()) as client:
        response = client.get("/metrics")
    content_type = response.headers["content-type"]
    assert content_type == CONTENT_TYPE_LATEST  # prometheus_client's own, as is
    assert content_type.count("charset") == 1
    # The body is in the format the header names: prometheus_client's parser reads it.
    assert ("kael_requests_total", (("status", "ok"),)) in samples(response.text)


def test_head_answers_like_get_without_a_body() -> None:
    with TestClient(make_app()) as client:
        for path in ("/health", "/ready", "/metrics"):
            got = client.get(path)
            headed = client.head(path)
            assert (headed.status_code, headed.content) == (got.status_code, b"")
            assert headed.headers["content-type"] == got.headers["content-type"]
            assert int(headed.headers["content-length"]) > 0


def test_head_on_ready_says_503_while_loading() -> None:
    loaded = threading.Event()

    def loader(metrics: Metrics) -> Generator:
        loaded.wait(10)
        return Generator(FakeModel(), ByteTokenizer(), metrics=metrics)

    with TestClient(create_app(loader)) as client:
        assert client.head("/ready").status_code == 503
        assert client.get("/ready").json() == {"status": "loading"}
        loaded.set()
