"""The OpenAI-compatible API, driven by the official ``openai`` client over the test client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from litestar import Litestar
from litestar.testing import TestClient

from .conftest import make_app, sse_payloads
from .fakes import FakeModel


def as_httpx(client: TestClient[Litestar]) -> Any:
    """Litestar's TestClient is an httpx.Client, which the openai client accepts as its transport
    (recent openai releases annotate the parameter with their own httpx fork's class)."""
    assert isinstance(client, httpx.Client)
    return client


SCRIPT = b"Hello world. The END is near. Goodbye"


@pytest.fixture
def scripted() -> Iterator[TestClient[Litestar]]:
    with TestClient(make_app(FakeModel(script=SCRIPT, max_positions=256))) as client:
        yield client


@pytest.fixture
def api(scripted: TestClient[Litestar]) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{scripted.base_url}/v1", api_key="unused", http_client=as_httpx(scripted), max_retries=0
    )


def test_models_lists_the_served_model(api: openai.OpenAI) -> None:
    (card,) = api.models.list().data
    assert card.id == "kael-gpt2"


def test_completion_with_usage_and_length_finish(api: openai.OpenAI) -> None:
    completion = api.completions.create(model="kael-gpt2", prompt="Hi", max_tokens=11)
    assert completion.choices[0].text == "Hello world"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (2, 11)
    assert completion.usage.total_tokens == 13
    assert completion.object == "text_completion"


def test_stop_string_ends_with_finish_reason_stop(api: openai.OpenAI) -> None:
    completion = api.completions.create(model="kael-gpt2", prompt="Hi", max_tokens=30, stop=[" is", "xyz"])
    assert completion.choices[0].text == "Hello world. The END"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.completion_tokens == 23


def test_streaming_matches_plain_and_holds_back_partial_stops(api: openai.OpenAI) -> None:
    plain = api.completions.create(model="kael-gpt2", prompt="Hi", max_tokens=30, stop=". The E")
    chunks = list(
        api.completions.create(
            model="kael-gpt2",
            prompt="Hi",
            max_tokens=30,
            stop=". The E",
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == plain.choices[0].text == "Hello world"
    # ". The E" arrives one byte per token: "." " " "T" ... were held back, never sent.
    assert not any("." in t for t in texts)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "stop" and set(finals[:-1]) == {None}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 18


def test_held_back_text_is_released_when_it_is_no_stop(api: openai.OpenAI) -> None:
    chunks = api.completions.create(model="kael-gpt2", prompt="Hi", max_tokens=13, stop="world!", stream=True)
    assert "".join(c.choices[0].text for c in chunks) == "Hello world. "


def test_seed_reproduces_sampling() -> None:
    with TestClient(make_app()) as client:
        api = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="x", http_client=as_httpx(client))
        runs = [
            api.completions.create(model="kael-gpt2", prompt="p", max_tokens=20, temperature=1.5, seed=s)
            .choices[0]
            .text
            for s in (7, 7, 8)
        ]
        assert runs[0] == runs[1] != runs[2]


def test_errors_have_openai_shape(api: openai.OpenAI, scripted: TestClient[Litestar]) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        api.completions.create(model="kael-gpt2", prompt="Hi", max_tokens=0)
    body = bad.value.body
    assert isinstance(body, dict)
    assert body["type"] == "invalid_request_error" and body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as many:
        api.completions.create(model="kael-gpt2", prompt="Hi", n=17)
    assert isinstance(many.value.body, dict) and many.value.body["param"] == "n"
    too_long = scripted.post("/v1/completions", json={"prompt": "x" * 250, "max_tokens": 10})
    assert too_long.status_code == 413
    assert too_long.json()["error"]["code"] == "context_length_exceeded"
    bad_bias = scripted.post("/v1/completions", json={"prompt": "x", "logit_bias": {"98765": 2}})
    assert bad_bias.status_code == 400 and bad_bias.json()["error"]["param"] == "logit_bias"
    assert "98765" not in bad_bias.text


def test_raw_stream_chunks_share_id_and_end_with_done(scripted: TestClient[Litestar]) -> None:
    response = scripted.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 5, "stream": True})
    events = sse_payloads(response.text)
    assert events[-1] == "[DONE]"
    assert len({e["id"] for e in events[:-1]}) == 1
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "Hello"
