"""Continuous batching (``--slots N``): requests joining the BatchScheduler's batch, and failing alone.

FakeBatchEngine picks tokens by FakeModel's rules, so each request's answer batched must be its
answer from the single-slot server; a Gate holds decode steps so the tests decide when requests
join. Here: requests joining at different steps, one cancelled, ready prompts sharing prefills
of at most ``prefill_tokens``, and failures in sampling, token handling, a shared prefill, a
prompt's first token or a decode step that end only the requests they hit. The queue, metrics
and shutdown are in test_batching_queue.py, several choices per job in test_batching_choices.py,
the numerics with kael's GPT-2 in test_batching_gpt2.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from kael_server.batching import BatchScheduler

from .asgi import Exchange
from .batch_apps import all_encoded, alone, batch_app, body, post, ready_together, scheduler_of
from .conftest import generator_of, samples
from .fake_batch_engine import FakeBatchEngine
from .fakes import SECRET, ByteTokenizer, Gate, PoisonTokenizer


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
