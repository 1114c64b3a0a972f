"""Apps around a BatchScheduler with a FakeBatchEngine, and helpers to drive them (tests/server/test_batching*.py).

``batch_app`` builds an app whose Generator schedules with a BatchScheduler over the given fake
engine; ``ready_together`` holds the worker at a step boundary until every request is ready, so
they join the batch together; ``alone`` gives the answers of the single-slot server, one request
at a time, the oracle a batched answer must equal.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from kael_server.batching import BatchScheduler
from litestar import Litestar

from kael_server import Generator, create_app

from .asgi import Exchange
from .conftest import generator_of, make_app, poll_until
from .fake_batch_engine import FakeBatchEngine
from .fakes import ByteTokenizer, FakeModel, Gate

__all__ = ["alone", "all_encoded", "batch_app", "body", "post", "ready_together", "scheduler_of"]


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
