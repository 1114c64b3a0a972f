"""Continuous batching (``--slots N``): the BatchScheduler's queue, metrics and shutdown.

With FakeBatchEngine and a Gate holding decode steps: a queue timeout and a full queue answer
429 with Retry-After, a queued request runs once a slot is free (and one that leaves the queue
gives its place back), the Prometheus metrics after a known sequence of requests, shutdown
stopping every slot and the queue, refused prompts and tokenizer failures giving their slot
back, and the ``--slots``/``--queue``/``--queue-timeout`` flags.
"""

from __future__ import annotations

import asyncio

import pytest
from kael_server.batching import BatchScheduler
from kael_server.cli import build_parser

from .asgi import Exchange
from .batch_apps import all_encoded, alone, batch_app, body, post, scheduler_of
from .conftest import generator_of, make_app, poll_until, samples
from .fake_batch_engine import FakeBatchEngine
from .fakes import SECRET, ByteTokenizer, Gate


@pytest.mark.anyio
async def test_queue_timeout_and_a_full_queue_answer_429_with_retry_after() -> None:
    gate = Gate()
    engine = FakeBatchEngine(1, gate=gate)
    app = batch_app(engine, queue=1, queue_timeout=0.2)
    holder = Exchange(app, "/generate", {"prompt": "a", "max_tokens": 3}).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 1)
    queued = Exchange(app, "/generate", {"prompt": "b", "max_tokens": 3, "stream": True}).start()
    await asyncio.to_thread(poll_until, lambda: len(scheduler_of(app).running()) == 2)
    full = await post(app, {"prompt": "c"})
    assert full.status == 429 and full.headers["retry-after"] == "1"
    await queued.finish()  # it waited its 0.2 s: 429, not a stream
    assert queued.status == 429 and queued.headers["retry-after"] == "1"
    assert "retry shortly" in body(queued)["detail"]
    openai = await post(app, {"prompt": "d"}, "/v1/completions")
    assert openai.status == 429 and body(openai)["error"]["type"] == "rate_limit_error"
    gate.open()
    await holder.finish()
    assert holder.status == 200
    m = samples(generator_of(app).metrics.render().decode())
    assert m[("kael_requests_total", (("status", "busy"),))] == 3
    assert m[("kael_queue_depth", ())] == 0
    assert m[("kael_queue_wait_seconds_count", ())] == 3  # the holder (0 s) and the two that gave up
    assert m[("kael_queue_wait_seconds_sum", ())] >= 0.4
    assert m[("kael_prompt_tokens_total", ())] == 1  # only the holder's prompt was accepted


@pytest.mark.anyio
async def test_a_queued_request_runs_once_a_slot_is_free() -> None:
    gate = Gate()
    engine = FakeBatchEngine(1, gate=gate)
    app = batch_app(engine, queue=2, queue_timeout=30)
    first = Exchange(app, "/generate", {"prompt": "first", "max_tokens": 2, "temperature": 0}).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 1)
    second = Exchange(app, "/generate", {"prompt": "second", "max_tokens": 4, "temperature": 0}).start()
    gone = Exchange(app, "/generate", {"prompt": "gone", "max_tokens": 4}).start()
    await asyncio.to_thread(poll_until, lambda: len(scheduler_of(app).running()) == 3)
    gone.disconnect()  # a client that leaves the queue is answered and gives its place back
    await gone.finish()
    assert gone.status == 499
    gate.open()
    await first.finish()
    await second.finish()
    want = await alone(
        [
            {"prompt": "first", "max_tokens": 2, "temperature": 0},
            {"prompt": "second", "max_tokens": 4, "temperature": 0},
        ]
    )
    assert [body(e)["text"] for e in (first, second)] == [body(w)["text"] for w in want]
    assert await asyncio.to_thread(scheduler_of(app).wait_idle, 10)
    assert [p for _, p in engine.prefills] == [list(b"first"), list(b"second")]  # never the one that left


@pytest.mark.anyio
async def test_metrics_after_a_known_sequence() -> None:
    gate = Gate()
    engine = FakeBatchEngine(2, gate=gate)
    app = batch_app(engine, queue=1, queue_timeout=30)
    metrics = generator_of(app).metrics
    a = Exchange(app, "/generate", {"prompt": "aa", "max_tokens": 3}).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 1)  # step 0: [a]
    b = Exchange(app, "/generate", {"prompt": "bbb", "max_tokens": 5, "stream": True}).start()
    await all_encoded(app, 2)
    gate.allow(1)
    assert await asyncio.to_thread(gate.wait_arrivals, 2)  # step 1: [a] (b's prefill shares its pass)
    c = Exchange(app, "/generate", {"prompt": "c", "max_tokens": 2}).start()
    await asyncio.to_thread(poll_until, lambda: len(scheduler_of(app).running()) == 3)
    assert (await post(app, {"prompt": "d"})).status == 429  # two slots busy, the queue full
    m = samples(metrics.render().decode())
    assert m[("kael_queue_depth", ())] == 1
    assert m[("kael_requests_in_flight", ())] == 3  # both slots and the queue
    await all_encoded(app, 3)  # c joins at the step after a leaves
    gate.open()
    for exchange in (a, b, c):
        await exchange.finish()
        assert exchange.status == 200
    assert await asyncio.to_thread(scheduler_of(app).wait_idle, 10)
    # a: prefill + steps 0, 1 (3 tokens); b: prefill (with step 1) + steps 2..5; c takes a's
    # slot: prefill (with step 2) + step 3. A request decodes from the step after its prefill.
    assert [len(rows) for rows in engine.steps] == [1, 1, 1, 2, 1, 1]
    m = samples(metrics.render().decode())
    assert m[("kael_batch_size_count", ())] == 6
    assert m[("kael_batch_size_sum", ())] == 7
    assert m[("kael_batch_size_bucket", (("le", "1.0"),))] == 5
    assert m[("kael_batch_size_bucket", (("le", "2.0"),))] == 6
    assert m[("kael_queue_depth", ())] == 0
    assert m[("kael_queue_wait_seconds_count", ())] == 3
    assert m[("kael_queue_wait_seconds_bucket", (("le", "0.005"),))] >= 2  # a and b had a slot at once
    assert m[("kael_requests_total", (("status", "ok"),))] == 3
    assert m[("kael_requests_total", (("status", "busy"),))] == 1
    assert m[("kael_generated_tokens_total", ())] == 3 + 5 + 2
    assert m[("kael_prompt_tokens_total", ())] == 2 + 3 + 1
    assert m[("kael_time_to_first_token_seconds_count", ())] == 3
    assert m[("kael_requests_in_flight", ())] == 0


@pytest.mark.anyio
async def test_shutdown_stops_every_slot_and_the_queue() -> None:
    gate = Gate()
    engine = FakeBatchEngine(2, gate=gate)
    app = batch_app(engine, queue=1, queue_timeout=30)
    server = app.state.server
    streams = [
        Exchange(app, "/generate", {"prompt": p, "max_tokens": 100, "stream": True}).start() for p in ("s1", "s2")
    ]
    await all_encoded(app, 2)
    gate.allow(3)  # the second may start a step after the first: then it decodes from step 2
    for stream in streams:
        await stream.wait_until(lambda e: len(e.events()) >= 2)
    queued = Exchange(app, "/generate", {"prompt": "q", "max_tokens": 5}).start()
    await asyncio.to_thread(poll_until, lambda: len(scheduler_of(app).running()) == 3)
    shutdown = asyncio.create_task(server.shutdown())
    await asyncio.sleep(0)  # one loop turn: shutdown cancels every job, then waits for the slots
    assert all(job.cancel_reason == "shutdown" for job in scheduler_of(app).running())
    gate.open()
    await shutdown
    for stream in streams:
        await stream.finish()
        assert stream.events()[-2:] == ['{"error":"server shutting down"}', "[DONE]"]
    await queued.finish()
    assert queued.status == 503
    assert not scheduler_of(app).running()
    assert len(engine.prefills) == 2  # the queued job never ran
    assert not engine.contexts


@pytest.mark.anyio
async def test_refused_prompts_and_tokenizer_failures_give_their_slot_back() -> None:
    engine = FakeBatchEngine(1)
    tokenizer = ByteTokenizer()
    app = batch_app(engine, tokenizer=tokenizer, max_positions=16)
    assert (await post(app, {"prompt": "a", "max_tokens": 99})).status == 413
    assert (await post(app, {"prompt": "a", "top_k": -1})).status == 422
    tokenizer.fail = True
    failed = await post(app, {"prompt": "a", "max_tokens": 2})
    assert failed.status == 500 and SECRET not in failed.received.decode()
    tokenizer.fail = False
    assert (await post(app, {"prompt": "ok", "max_tokens": 2})).status == 200
    assert await asyncio.to_thread(scheduler_of(app).wait_idle, 10)
    assert engine.prefills == [(0, list(b"ok"))]  # only the accepted prompt reached the engine
    m = samples(generator_of(app).metrics.render().decode())
    assert m[("kael_prompt_tokens_total", ())] == 2
    assert m[("kael_requests_total", (("status", "rejected"),))] == 2


def test_the_flags_parse_and_a_default_server_queues() -> None:
    assert isinstance(generator_of(make_app()).scheduler, BatchScheduler)  # a Generator built without a loader too
    args = build_parser().parse_args([])
    assert (args.slots, args.queue, args.queue_timeout) == (1, 64, 10.0)
    args = build_parser().parse_args(["--slots", "8", "--queue", "4", "--queue-timeout", "2.5"])
    assert (args.slots, args.queue, args.queue_timeout) == (8, 4, 2.5)
    for bad in (["--slots", "0"], ["--queue", "-1"], ["--queue-timeout", "nan"], ["--slots", "two"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(bad)
