"""Continuous batching (``--slots N``): several choices per job (``n``, prompt lists).

One prefill per prompt, forked into its choices' rows; a job wider than the batch refused, and
a wide one waiting for its rows or running alone on the spare rows of a one-slot server; a
failing choice ending its whole job; and penalties, logit bias, logprobs and nucleus sampling
next to plain greedy rows answering as alone. Oracle: the single-slot server's answers, with
FakeBatchEngine picking tokens by FakeModel's rules.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from kael_server.batching import BatchScheduler

from .asgi import Exchange
from .batch_apps import batch_app, body, post, ready_together, scheduler_of
from .conftest import generator_of, make_app, poll_until, samples
from .fake_batch_engine import FakeBatchEngine
from .fakes import SECRET, Gate

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
