"""The event loop keeps answering while prompts are encoded and generations run on workers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from litestar.testing import TestClient

from .conftest import make_app
from .fakes import ByteTokenizer, FakeModel, Gate


def test_health_answers_while_a_long_prompt_is_encoded() -> None:
    gate = Gate()
    tokenizer = ByteTokenizer(gate=gate)
    with TestClient(make_app(tokenizer=tokenizer)) as client, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.post, "/generate", json={"prompt": "x" * 8192, "max_tokens": 1})
        assert gate.wait_arrivals(1)  # encode() has started and is blocked on its thread
        for _ in range(5):
            assert client.get("/health").json() == {"status": "ok"}
        assert client.get("/metrics").status_code == 200
        assert not pending.done()
        gate.open()
        response = pending.result(timeout=10)
        assert response.status_code == 413  # 8192 prompt tokens do not fit in 128
        assert tokenizer.encoded == ["x" * 8192]


def test_health_answers_while_a_generation_runs() -> None:
    gate = Gate(allowed=1)
    with TestClient(make_app(FakeModel(gate=gate))) as client, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.post, "/generate", json={"prompt": "a", "max_tokens": 10})
        assert gate.wait_arrivals(2)  # one token made, the model is busy with the second
        for _ in range(5):
            assert client.get("/health").status_code == 200
        assert client.get("/ready").status_code == 200
        assert not pending.done()
        gate.open()
        assert pending.result(timeout=10).json()["tokens"] == 10


def test_tokenize_runs_off_the_event_loop() -> None:
    gate = Gate()
    with TestClient(make_app(tokenizer=ByteTokenizer(gate=gate))) as client, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.post, "/tokenize", json={"prompt": "abc"})
        assert gate.wait_arrivals(1)
        assert client.get("/health").status_code == 200
        gate.open()
        assert pending.result(timeout=10).json()["tokens"] == [97, 98, 99]
