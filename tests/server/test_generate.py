"""POST /generate with fake models: token counts, determinism, streaming, UTF-8, sampling arguments."""

from __future__ import annotations

import random

from litestar import Litestar
from litestar.testing import TestClient

from kael_server import Generator, create_app

from .conftest import make_app, sse_payloads
from .fakes import EOT, ByteTokenizer, FakeModel


def test_plain_answer_has_requested_token_count(client: TestClient[Litestar], model: FakeModel) -> None:
    response = client.post("/generate", json={"prompt": "Hello", "max_tokens": 7, "temperature": 0})
    assert response.status_code == 200
    body = response.json()
    assert body["tokens"] == 7
    assert len(body["text"]) == 7  # the fake emits one ASCII letter per token
    assert body["seconds"] >= 0
    assert model.calls[0].prompt == list(b"Hello")
    assert model.calls[0].max_new_tokens == 7


def test_defaults_follow_the_issue(client: TestClient[Litestar], model: FakeModel) -> None:
    assert client.post("/generate", json={"prompt": "x"}).json()["tokens"] == 64
    call = model.calls[0]
    assert (call.max_new_tokens, call.temperature, call.top_k) == (64, 0.8, 40)


def test_continuation_only_matches_independent_oracle(client: TestClient[Litestar]) -> None:
    # Oracle: greedy fake picks chr(97 + sum(context) % 26), computed here independently.
    context = list(b"ab")
    expected = ""
    for _ in range(5):
        token = 97 + sum(context) % 26
        context.append(token)
        expected += chr(token)
    body = client.post("/generate", json={"prompt": "ab", "max_tokens": 5, "temperature": 0}).json()
    assert body["text"] == expected


def test_temperature_zero_is_deterministic(client: TestClient[Litestar]) -> None:
    request = {"prompt": "same prompt", "max_tokens": 20, "temperature": 0}
    texts = {client.post("/generate", json=request).json()["text"] for _ in range(3)}
    assert len(texts) == 1


def test_seed_makes_sampling_reproducible(client: TestClient[Litestar], model: FakeModel) -> None:
    request = {"prompt": "p", "max_tokens": 30, "temperature": 1.0, "seed": 1234}
    first = client.post("/generate", json=request).json()["text"]
    second = client.post("/generate", json=request).json()["text"]
    assert first == second
    rng = random.Random(1234)
    assert first == "".join(chr(97 + rng.randrange(26)) for _ in range(30))
    assert isinstance(model.calls[0].generator, random.Random)


def test_streamed_text_equals_plain_text(client: TestClient[Litestar]) -> None:
    request = {"prompt": "stream me", "max_tokens": 25, "temperature": 0}
    plain = client.post("/generate", json=request).json()["text"]
    response = client.post("/generate", json={**request, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_payloads(response.text)
    assert events[-1] == "[DONE]"
    assert "".join(e["text"] for e in events[:-1]) == plain
    assert all(set(e) == {"text"} and e["text"] for e in events[:-1])


def test_multibyte_characters_are_never_split() -> None:
    model = FakeModel(script=b"\xc3\xb1\xe2\x82\xac")
    with TestClient(make_app(model)) as client:
        response = client.post("/generate", json={"prompt": "x", "max_tokens": 5, "stream": True})
        assert sse_payloads(response.text) == [{"text": "ñ"}, {"text": "€"}, "[DONE]"]
        plain = client.post("/generate", json={"prompt": "x", "max_tokens": 5}).json()
        assert plain == {"text": "ñ€", "tokens": 5, "seconds": plain["seconds"]}
        # A character cut off by max_tokens ends as U+FFFD, never as a half-sent byte.
        cut = client.post("/generate", json={"prompt": "x", "max_tokens": 4}).json()["text"]
        assert cut == "ñ\ufffd"
        assert "\ufffd" not in response.text


def test_end_of_text_stops_generation_and_is_not_returned() -> None:
    model = FakeModel(script=[104, 105, EOT, 106])
    with TestClient(make_app(model)) as client:
        body = client.post("/generate", json={"prompt": "x", "max_tokens": 10}).json()
        assert (body["text"], body["tokens"]) == ("hi", 2)


def test_top_k_is_clamped_to_the_vocabulary(client: TestClient[Litestar], model: FakeModel) -> None:
    client.post("/generate", json={"prompt": "x", "max_tokens": 1, "top_k": 1_000_000})
    client.post("/generate", json={"prompt": "x", "max_tokens": 1, "top_k": 5})
    assert [c.top_k for c in model.calls] == [model.vocab_size, 5]


def test_unseeded_sampling_gets_fresh_seeds_and_greedy_none() -> None:
    seeds: list[int] = []

    def make_rng(seed: int) -> random.Random:
        seeds.append(seed)
        return random.Random(seed)

    with TestClient(create_app(Generator(FakeModel(), ByteTokenizer(), make_rng=make_rng))) as client:
        for _ in range(3):
            client.post("/generate", json={"prompt": "p", "max_tokens": 2})
        client.post("/generate", json={"prompt": "p", "max_tokens": 2, "seed": 77})
        client.post("/generate", json={"prompt": "p", "max_tokens": 2, "temperature": 0})
    assert len(seeds) == 4 and seeds[3] == 77  # greedy needs no random generator
    assert len(set(seeds[:3])) == 3 and all(0 <= s < 2**63 for s in seeds[:3])
