"""Prometheus metrics after a known sequence of requests, checked sample by sample."""

from __future__ import annotations

import asyncio
import sys

import pytest

from .asgi import Exchange
from .conftest import generator_of, make_app, samples
from .fakes import FakeModel, Gate


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
