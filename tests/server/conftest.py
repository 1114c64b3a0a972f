"""Fixtures for kael_server tests: apps around fake models, Prometheus sample lookup."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from kael_server import Generator, create_app

from .fakes import ByteTokenizer, FakeModel


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_app(model: FakeModel | None = None, tokenizer: ByteTokenizer | None = None) -> Litestar:
    return create_app(Generator(model or FakeModel(), tokenizer or ByteTokenizer(), make_rng=random.Random))


def generator_of(app: Litestar) -> Generator:
    generator = app.state.server.generator
    assert generator is not None
    return generator


@pytest.fixture
def model() -> FakeModel:
    return FakeModel()


@pytest.fixture
def app(model: FakeModel) -> Litestar:
    return make_app(model)


@pytest.fixture
def client(app: Litestar) -> Iterator[TestClient[Litestar]]:
    with TestClient(app) as test_client:
        yield test_client


def poll_until(condition: Callable[[], bool], timeout: float = 10, interval: float = 0.02) -> bool:
    """Checks ``condition`` until it holds or ``timeout`` seconds pass (for states with no event to wait on)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def sse_payloads(text: str) -> list[Any]:
    """The JSON payloads of a server-sent event body, with "[DONE]" kept as a string."""
    payloads: list[Any] = []
    for block in text.split("\n\n"):
        if block:
            assert block.startswith("data: "), block
            data = block[len("data: ") :]
            payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


def samples(metrics_text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus exposition, keyed by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics_text)
        for s in family.samples
    }


def metric(client: TestClient[Litestar], name: str, **labels: str) -> float:
    return samples(client.get("/metrics").text)[(name, tuple(sorted(labels.items())))]
