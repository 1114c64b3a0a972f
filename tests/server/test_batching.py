"""Continuous batching (``--slots N``): the BatchScheduler around fake engines.

FakeBatchEngine picks tokens by FakeModel's rules, so each request's answer batched must be
its answer from the single-slot server; a Gate holds decode steps so the tests decide when
requests join. The numerics with kael's GPT-2 are in test_batching_gpt2.py.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from kael_server.batching import BatchScheduler
from kael_server.cli import build_parser
from litestar import Litestar

from kael_server import Generator, create_app

from .asgi import Exchange
from .conftest import generator_of, make_app, poll_until, samples
from .fake_batch_engine import FakeBatchEngine
from .fakes import SECRET, ByteTokenizer, FakeModel, Gate, PoisonTokenizer


def batch_app(
    engine: FakeBatchEngine,
    *,
    queue: int = 0,
    queue_timeout: float = 10.0,
    tokenizer: ByteTokenizer | None = None,
    max_positions: int = 128,
    prefill_tokens: int = 256,
    slots: int | None = None,
) -> Litestar:
    generator = Generator(
        FakeModel(max_positions=max_positions),
        tokenizer or ByteTokenizer(),
        make_rng=random.Random,
        make_scheduler=lambda g: BatchScheduler(
            g, engine, queue=queue, queue_timeout=queue_timeout, prefill_tokens=prefill_tokens, slots=slots
        ),
    )
    return create_app(generator)


def scheduler_of(app: Litestar) -> BatchScheduler:
    scheduler = generator_of(app).scheduler
    assert isinstance(scheduler, BatchScheduler)
    return scheduler


async def all_encoded(app: Litestar, n: int) -> None:
    """Waits until n admitted jobs (in a slot or queued) have their prompt encoded: one in a slot
    joins the batch at the next step boundary."""
    scheduler = scheduler_of(app)

    def ready() -> bool:
        with scheduler._changed:
            return sum(e.ids is not None for e in (*scheduler._slotted.values(), *scheduler._queue)) >= n

    assert await asyncio.to_thread(poll_until, ready)


async def ready_together(
    app: Litestar, gate: Gate, first: dict[str, Any], payloads: list[dict[str, Any]], path: str = "/generate"
) -> tuple[Exchange, list[Exchange]]:
    """Starts ``first`` and holds the worker before its first decode step, then starts
    ``payloads``, so they are all ready at the next step boundary; runs everything to the end."""
    held = Exchange(app, path, first).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 1)  # the worker waits before step 0
    rest = [Exchange(app, path, p).start() for p in payloads]
    await all_encoded(app, 1 + len(payloads))
    gate.open()
    for exchange in (held, *rest):
        await exchange.finish()
    return held, rest


async def post(app: Litestar, payload: dict[str, Any], path: str = "/generate") -> Exchange:
    exchange = Exchange(app, path, payload).start()
    await exchange.finish()
    return exchange


async def alone(payloads: list[dict[str, Any]]) -> list[Exchange]:
    """The answers of the single-slot server, one request at a time."""
    app = make_app()
    return [await post(app, p) for p in payloads]


def body(exchange: Exchange) -> Any:
    return json.loads(exchange.received)


@pytest.mark.anyio
async def test_requests_joining_at_different_steps_get_their_answers_alone() -> None:
    gate = Gate()
    engine = FakeBatchEngine(4, gate=gate)
    app = batch_app(engine)
    payloads = [
        {"prompt": "hello", "max_tokens": 9, "temperature": 0},
        {"prompt": "a much longer prompt", "max_tokens": 6, "temperature": 0},
        {"prompt": "x", "max_tokens": 7, "temperature": 0},
        {"prompt": "seeded", "max_tokens": 8, "temperature": 0.7, "seed": 5},
    ]
    first = Exchange(app, "/generate", payloads[0]).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 1)  # step 0: the first request alone
    second = Exchange(app, "/generate", {**payloads[1], "stream": True}).start()
    await all_encoded(app, 2)
    gate.allow(2)  # steps 0 and 1; the second joins at step 1
    assert await asyncio.to_thread(gate.wait_arrivals, 3)
    third = Exchange(app, "/generate", payloads[2]).start()
    fourth = Exchange(app, "/generate", payloads[3]).start()
    await all_encoded(app, 4)
    gate.open()
    for exchange in (first, second, third, fourth):
        await exchange.finish()
    want = await alone(payloads)
    assert [body(e)["text"] for e in (first, third, fourth)] == [body(want[i])["text"] for i in (0, 2, 3)]
    streamed = second.events()
    assert streamed[-1] == "[DONE]"
    assert "".join(json.loads(e)["text"] for e in streamed[:-1]) == body(want[1])["text"]
    # a request decodes from the step after its prefill (kael.engine: one forward pass per step)
    assert [len(rows) for rows in engine.steps[:5]] == [1, 1, 2, 2, 4]
    assert [len(rows) for rows in engine.prefill_calls] == [1, 1, 2]  # the third and fourth: one call
    assert engine.greedy_calls >= 5  # the greedy rows of a step: one call
    assert sorted(len(p) for _, p in engine.prefills) == sorted(len(str(p["prompt"])) for p in payloads)
    assert sorted(engine.released) == [0, 1, 2, 3]
    assert not engine.contexts  # every row was given back


@pytest.mark.anyio
async def test_a_cancelled_request_leaves_the_others_unchanged() -> None:
    gate = Gate()
    engine = FakeBatchEngine(3, gate=gate)
    app = batch_app(engine)
    stay = Exchange(app, "/generate", {"prompt": "stay", "max_tokens": 8, "temperature": 0}).start()
    leave = Exchange(app, "/generate", {"prompt": "leave", "max_tokens": 50, "stream": True}).start()
    await all_encoded(app, 2)
    gate.allow(4)  # "leave" may start a step after "stay": then it decodes from step 2
    await leave.wait_until(lambda e: len(e.events()) >= 3)
    leave.disconnect()
    await leave.finish()
    gate.open()
    await stay.finish()
    assert await asyncio.to_thread(scheduler_of(app).wait_idle, 10)
    assert body(stay)["text"] == body((await alone([{"prompt": "stay", "max_tokens": 8, "temperature": 0}]))[0])["text"]
    assert max(len(rows) for rows in engine.steps) == 2
    assert len(engine.steps[-1]) == 1  # the cancelled one left; the other finished alone
    m = samples(generator_of(app).metrics.render().decode())
    assert m[("kael_requests_total", (("status", "cancelled"),))] == 1
    assert m[("kael_requests_total", (("status", "ok"),))] == 1
    assert m[("kael_requests_in_flight", ())] == 0


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["sampling", "token handling"])
async def test_a_failing_request_ends_alone(where: str) -> None:
    bad = tuple(b"bad")

    def doomed(context: tuple[int, ...]) -> bool:  # the "bad" request, at its third token
        return context[:3] == bad and len(context) == 3 + 2

    poison = 0x7F
    if where == "sampling":
        engine, tokenizer = FakeBatchEngine(4, fail_sample=doomed), ByteTokenizer()
    else:
        engine = FakeBatchEngine(4, poison=doomed, poison_token=poison)
        tokenizer = PoisonTokenizer(poison)
    engine.gate = gate = Gate()
    app = batch_app(engine, tokenizer=tokenizer)
    payloads = [{"prompt": p, "max_tokens": 8, "temperature": 0} for p in ("good", "bad", "fine")]
    exchanges = [Exchange(app, "/generate", p).start() for p in payloads]
    streamed = Exchange(app, "/generate", {**payloads[1], "stream": True}).start()
    await all_encoded(app, 4)
    gate.open()
    for exchange in (*exchanges, streamed):
        await exchange.finish()
    want = await alone(payloads)
    assert [e.status for e in exchanges] == [200, 500, 200]
    assert body(exchanges[1])["detail"] == "generation failed"
    assert streamed.events()[-2:] == ['{"error":"generation failed"}', "[DONE]"]
    assert SECRET not in exchanges[1].received.decode() + streamed.received.decode()
    assert [body(exchanges[i])["text"] for i in (0, 2)] == [body(want[i])["text"] for i in (0, 2)]
    assert max(len(rows) for rows in engine.steps) >= 3  # they did share steps
    assert engine.greedy_calls >= 2  # shared greedy picks, then each alone when one failed
    again = await post(app, payloads[0])
    assert body(again) == body(exchanges[0]) | {"seconds": body(again)["seconds"]}


@pytest.mark.anyio
async def test_a_failing_prompt_in_a_shared_prefill_ends_alone() -> None:
    gate = Gate()
    engine = FakeBatchEngine(4, gate=gate, fail_prefill=lambda prompt: prompt == tuple(b"bad"))
    app = batch_app(engine)
    payloads = [{"prompt": p, "max_tokens": 5, "temperature": 0} for p in ("first", "good", "bad", "fine")]
    first, rest = await ready_together(app, gate, payloads[0], payloads[1:])
    assert [e.status for e in (first, *rest)] == [200, 200, 500, 200]
    assert body(rest[1])["detail"] == "generation failed"
    assert SECRET not in rest[1].received.decode()
    want = await alone([payloads[i] for i in (0, 1, 3)])
    assert [body(e)["text"] for e in (first, rest[0], rest[2])] == [body(w)["text"] for w in want]
    # the three prompts ready together went in one call; it failed, so each ran alone
    assert [len(rows) for rows in engine.prefill_calls] == [1, 3, 1, 1, 1]
    assert [p for _, p in engine.prefills] == [list(b"first"), list(b"good"), list(b"fine")]
    assert sorted(engine.released) == [0, 1, 2, 3] and not engine.contexts
    m = samples(generator_of(app).metrics.render().decode())
    assert m[("kael_requests_total", (("status", "error"),))] == 1
    assert m[("kael_requests_in_flight", ())] == 0


@pytest.mark.anyio
async def test_ready_prompts_share_prefills_of_at_most_prefill_tokens() -> None:
    gate = Gate()
    engine = FakeBatchEngine(6, gate=gate)
    app = batch_app(engine, prefill_tokens=8)
    prompts = ["abcde", "xyz", "a long prompt", "hi", "ok"]  # 13 tokens: over the budget of 8
    payloads = [{"prompt": p, "max_tokens": 3, "temperature": 0} for p in prompts]
    _, rest = await ready_together(app, gate, {"prompt": "go", "max_tokens": 3, "temperature": 0}, payloads)
    assert max(engine.plan_tokens) <= 8  # each step's prefill chunks and decode tokens
    assert any(len(rows) >= 2 for rows in engine.prefill_calls)  # short prompts share a step
    long = [(start, n) for prompt, start, n in engine.chunks if prompt == tuple(b"a long prompt")]
    assert len(long) >= 2 and sum(n for _, n in long) == 13  # chunked prefill, in order
    assert [start for start, _ in long] == [sum(n for _, n in long[:i]) for i in range(len(long))]
    assert sorted(len(p) for _, p in engine.prefills) == [2, 2, 2, 3, 5, 13]
    want = await alone(payloads)
    assert [body(e)["text"] for e in rest] == [body(w)["text"] for w in want]
    with pytest.raises(ValueError, match="prefill_tokens must be >= 1"):
        BatchScheduler(generator_of(app), engine, prefill_tokens=0)


@pytest.mark.anyio
async def test_a_prompt_failing_in_its_prefill_or_first_token_ends_alone() -> None:
    engine = FakeBatchEngine(
        2, fail_prefill=lambda prompt: prompt == tuple(b"bad"), fail_sample=lambda context: context == tuple(b"first")
    )
    app = batch_app(engine)
    payload = {"prompt": "ok", "max_tokens": 3, "temperature": 0}
    bad = await post(app, {"prompt": "bad", "max_tokens": 3})
    first = await post(app, {"prompt": "first", "max_tokens": 3, "temperature": 0})
    ok = await post(app, payload)
    assert (bad.status, first.status, ok.status) == (500, 500, 200)
    assert SECRET not in bad.received.decode() + first.received.decode()
    assert body(ok)["text"] == body((await alone([payload]))[0])["text"]
    assert [len(rows) for rows in engine.prefill_calls] == [1, 1, 1]
    assert [p for _, p in engine.prefills] == [list(b"first"), list(b"ok")]  # the bad prompt started nothing
    assert not engine.contexts  # every row was given back
    m = samples(generator_of(app).metrics.render().decode())
    assert m[("kael_requests_total", (("status", "error"),))] == 2
    assert m[("kael_requests_in_flight", ())] == 0


@pytest.mark.anyio
async def test_a_failing_decode_step_fails_its_batch_and_the_server_goes_on() -> None:
    gate = Gate()
    engine = FakeBatchEngine(2, gate=gate, fail_decode_at=2)
    app = batch_app(engine)
    one = Exchange(app, "/generate", {"prompt": "one", "max_tokens": 5}).start()
    two = Exchange(app, "/generate", {"prompt": "two", "max_tokens": 5}).start()
    await all_encoded(app, 2)
    gate.open()
    await one.finish()
    await two.finish()
    # the third decode step failed while both sequences shared it (whether the first two
    # already had both depends on when the second prefill ran)
    assert len(engine.steps) == 3 and len(engine.steps[-1]) == 2
    assert (one.status, two.status) == (500, 500)
    later = await post(app, {"prompt": "three", "max_tokens": 3, "temperature": 0})
    assert later.status == 200
    assert (
        body(later)["text"] == body((await alone([{"prompt": "three", "max_tokens": 3, "temperature": 0}]))[0])["text"]
    )


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


# ---- several choices per job (n, prompt lists): one prefill per prompt, forked ----------------


@pytest.mark.anyio
async def test_n_choices_share_one_prefill_and_fork_into_their_rows() -> None:
    gate = Gate()
    engine = FakeBatchEngine(7, gate=gate)
    app = batch_app(engine)
    seeded = {"prompt": "seed me", "max_tokens": 7, "temperature": 0.9, "n": 3, "seed": 21}
    prompts = {"prompt": ["ab", "xyz"], "max_tokens": 5, "temperature": 0, "n": 2}
    first, rest = await ready_together(app, gate, seeded, [prompts], path="/v1/completions")
    assert first.status == rest[0].status == 200
    # one prefill row per prompt ("ab" and "xyz" in one call), forked into its other choices' rows
    assert engine.prefill_calls == [[0], [3, 4]]
    assert [p for _, p in engine.prefills] == [list(b"seed me"), list(b"ab"), list(b"xyz")]
    assert engine.forks == [(0, 1), (0, 2), (3, 5), (4, 6)]
    single = make_app()
    for exchange, payload in ((first, seeded), (rest[0], prompts)):
        want = body(await post(single, payload, "/v1/completions"))["choices"]
        assert body(exchange)["choices"] == want
    assert sorted(engine.released) == [0, 1, 2, 3, 4, 5, 6] and not engine.contexts
    assert max(len(rows) for rows in engine.steps) == 3 + 4  # all seven rows decoded side by side


@pytest.mark.anyio
async def test_a_job_wider_than_the_batch_is_refused_and_a_wide_one_waits_for_its_rows() -> None:
    gate = Gate()
    engine = FakeBatchEngine(2, gate=gate)
    app = batch_app(engine, queue=2, queue_timeout=30)
    wide = await post(app, {"prompt": "a", "n": 3}, "/v1/completions")
    assert wide.status == 400 and body(wide)["error"]["param"] == "n"
    assert "at most 2 sequences" in body(wide)["error"]["message"]
    holder = Exchange(app, "/v1/completions", {"prompt": "h", "max_tokens": 3, "temperature": 0}).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 1)
    pair = Exchange(app, "/v1/completions", {"prompt": "p", "max_tokens": 2, "temperature": 0, "n": 2}).start()
    await asyncio.to_thread(poll_until, lambda: len(scheduler_of(app).running()) == 2)
    with scheduler_of(app)._changed:
        assert [e.job for e in scheduler_of(app)._queue] == scheduler_of(app).running()[1:]  # it waits: one row free
    gate.open()
    await holder.finish()
    await pair.finish()
    assert pair.status == 200 and [c["index"] for c in body(pair)["choices"]] == [0, 1]
    assert engine.prefills[-1][1] == list(b"p") and engine.forks[-1][1] != engine.forks[-1][0]
    m = samples(generator_of(app).metrics.render().decode())
    assert m[("kael_queue_wait_seconds_count", ())] == 2


@pytest.mark.anyio
async def test_a_job_wider_than_the_slots_runs_alone_on_the_spare_rows() -> None:
    # one slot, four rows: n=3 is answered (as a one-slot server always did), and it waits while
    # another job holds the slot, then the next job waits for it in turn
    gate = Gate()
    engine = FakeBatchEngine(4, gate=gate)
    app = batch_app(engine, queue=4, queue_timeout=30, slots=1)
    assert scheduler_of(app).capacity == 1 and scheduler_of(app).widest == 4
    holder = Exchange(app, "/v1/completions", {"prompt": "h", "max_tokens": 3, "temperature": 0}).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 1)
    wide = Exchange(app, "/v1/completions", {"prompt": "w", "max_tokens": 2, "temperature": 0, "n": 3}).start()
    after = Exchange(app, "/v1/completions", {"prompt": "a", "max_tokens": 2, "temperature": 0}).start()
    await asyncio.to_thread(poll_until, lambda: len(scheduler_of(app).running()) == 3)
    with scheduler_of(app)._changed:
        assert len(scheduler_of(app)._queue) == 2  # the wide job and the one after it wait
    gate.open()
    await holder.finish()
    await wide.finish()
    await after.finish()
    assert holder.status == wide.status == after.status == 200
    texts = [c["text"] for c in body(wide)["choices"]]
    assert len(texts) == 3 and texts[0] == texts[1] == texts[2]  # greedy choices agree
    assert [p[1] for p in engine.prefills] == [list(b"h"), list(b"w"), list(b"a")]  # one at a time, in order
    with pytest.raises(ValueError, match="slots"):
        BatchScheduler(generator_of(app), FakeBatchEngine(2), slots=3)


@pytest.mark.anyio
async def test_a_failing_choice_ends_its_whole_job_and_gives_every_row_back() -> None:
    gate = Gate()

    firsts = [97 + random.Random(30 + i).randrange(26) for i in (0, 1)]  # the fakes draw from random.Random(seed)
    assert firsts[0] != firsts[1]

    def doomed(context: tuple[int, ...]) -> bool:  # choice 1 of the "bad" job, at its second token
        return context == (*b"bad", firsts[1])

    engine = FakeBatchEngine(5, gate=gate, fail_sample=doomed)
    app = batch_app(engine)
    good = {"prompt": "good", "max_tokens": 6, "temperature": 0}
    bad = {"prompt": "bad", "max_tokens": 6, "temperature": 1.0, "n": 2, "seed": 30}
    first, rest = await ready_together(app, gate, good, [bad], path="/v1/completions")
    assert first.status == 200 and rest[0].status == 500
    assert SECRET not in rest[0].received.decode()
    want = body(await post(make_app(), good, "/v1/completions"))["choices"]
    assert body(first)["choices"] == want
    assert not engine.contexts and sorted(engine.released) == [0, 1, 2]


@pytest.mark.anyio
async def test_penalties_bias_and_logprobs_next_to_plain_greedy_rows_are_as_alone() -> None:
    gate = Gate()
    engine = FakeBatchEngine(5, gate=gate)
    app = batch_app(engine)
    plain: list[dict[str, Any]] = [{"prompt": p, "max_tokens": 8, "temperature": 0} for p in ("one", "two")]
    special: list[dict[str, Any]] = [
        {"prompt": "pen", "max_tokens": 8, "temperature": 0, "frequency_penalty": 1.5, "logprobs": 2},
        {"prompt": "nuc", "max_tokens": 8, "temperature": 0.8, "top_p": 0.5, "min_p": 0.1, "seed": 4},
        {"prompt": "bias", "max_tokens": 8, "temperature": 0, "logit_bias": {"66": 3.5}, "echo": True},
    ]
    first, rest = await ready_together(
        app, gate, {**plain[0], "stream": True}, [plain[1], *special], path="/v1/completions"
    )
    single = make_app()
    want = [body(await post(single, p, "/v1/completions"))["choices"] for p in (plain[1], *special)]
    assert [body(e)["choices"] for e in rest] == want
    streamed = "".join(json.loads(e)["choices"][0]["text"] for e in first.events()[:-1])
    assert streamed == body(await post(single, plain[0], "/v1/completions"))["choices"][0]["text"]
    assert engine.greedy_calls >= 5  # the two plain greedy rows still share one greedy call per step
