"""Request limits: body cap before parsing, validation errors (422) that never echo input, context size."""

from __future__ import annotations

import json

import pytest
from kael_server.limits import MAX_BODY_BYTES
from litestar import Litestar
from litestar.testing import TestClient

from .asgi import Exchange
from .conftest import make_app, metric
from .fakes import ByteTokenizer, FakeModel


def test_body_cap_is_six_bytes_per_prompt_char_plus_slack() -> None:
    assert MAX_BODY_BYTES == 6 * 8192 + 1024 == 50_176


def test_body_at_the_cap_is_accepted_one_byte_more_is_413(client: TestClient[Litestar]) -> None:
    head = b'{"prompt": "x", "max_tokens": 1}'
    at_cap = head + b" " * (MAX_BODY_BYTES - len(head))
    assert client.post("/generate", content=at_cap).status_code == 200
    over = client.post("/generate", content=at_cap + b" ")
    assert over.status_code == 413
    assert over.json()["detail"] == "request body too large"


def test_oversized_body_is_refused_before_parsing(client: TestClient[Litestar], model: FakeModel) -> None:
    # Not even JSON: a 422 would mean it was parsed.
    response = client.post("/generate", content=b"\xff" * (MAX_BODY_BYTES + 1))
    assert response.status_code == 413
    assert model.calls == []
    assert metric(client, "kael_requests_total", status="rejected") == 1


@pytest.mark.anyio
async def test_chunked_body_is_refused_as_soon_as_it_passes_the_cap() -> None:
    app = make_app()
    chunk = b" " * 20_000
    exchange = Exchange(app, "/generate", chunks=[chunk] * 10).start()  # 200 kB, no Content-Length
    await exchange.finish()
    assert exchange.status == 413
    assert exchange.chunks_read == 3  # the third chunk crossed 50,176 bytes: the rest stayed unread


def test_declared_oversized_content_length_is_refused_unread(client: TestClient[Litestar]) -> None:
    response = client.post("/generate", content=b"{}", headers={"content-length": str(MAX_BODY_BYTES + 1)})
    assert response.status_code == 413


LONE_SURROGATE = b'{"prompt": "\\ud800"}'
INVALID_BODIES: dict[str, tuple[bytes, str]] = {
    "malformed json": (b'{"prompt": "abc"', "body"),
    "not an object": (b'["prompt"]', "body"),
    "unknown field": (b'{"prompt": "a", "sneaky_field_zq": 1}', "body"),
    "missing prompt": (b'{"max_tokens": 3}', "prompt"),
    "empty prompt": (b'{"prompt": ""}', "prompt"),
    "prompt too long": (json.dumps({"prompt": "q" * 8193}).encode(), "prompt"),
    "prompt not a string": (b'{"prompt": 987654321}', "prompt"),
    "lone surrogate": (LONE_SURROGATE, "body"),
    "max_tokens zero": (b'{"prompt": "a", "max_tokens": 0}', "max_tokens"),
    "max_tokens too big": (b'{"prompt": "a", "max_tokens": 513}', "max_tokens"),
    "max_tokens float": (b'{"prompt": "a", "max_tokens": 5.5}', "max_tokens"),
    "max_tokens bool": (b'{"prompt": "a", "max_tokens": true}', "max_tokens"),
    "temperature negative": (b'{"prompt": "a", "temperature": -0.5}', "temperature"),
    "temperature too big": (b'{"prompt": "a", "temperature": 10.5}', "temperature"),
    "temperature tiny": (b'{"prompt": "a", "temperature": 1e-40}', "temperature"),
    "top_k huge": (b'{"prompt": "a", "top_k": 1180591620717411303424}', "top_k"),
    "top_k negative": (b'{"prompt": "a", "top_k": -1}', "top_k"),
    "top_k over a million": (b'{"prompt": "a", "top_k": 1000001}', "top_k"),
    "stream not bool": (b'{"prompt": "a", "stream": "yes"}', "stream"),
    "seed negative": (b'{"prompt": "a", "seed": -7}', "seed"),
}


@pytest.mark.parametrize("body,loc", INVALID_BODIES.values(), ids=INVALID_BODIES.keys())
def test_invalid_body_is_422_with_errors_that_never_echo_input(
    client: TestClient[Litestar], model: FakeModel, body: bytes, loc: str
) -> None:
    response = client.post("/generate", content=body)
    assert response.status_code == 422
    answer = response.json()
    assert answer["detail"] == "invalid request"
    assert loc in [e["loc"] for e in answer["errors"]]
    assert all(set(e) == {"loc", "msg"} for e in answer["errors"])
    for echo in (b"sneaky_field_zq", b"987654321", b"1180591620717411303424", b"1e-40", b"qqqq", b"ud800", b"yes"):
        assert echo not in response.content
    assert model.calls == []
    assert metric(client, "kael_requests_total", status="rejected") == 1
    assert metric(client, "kael_requests_in_flight") == 0
    assert metric(client, "kael_requests_total", status="ok") == 0


def test_every_problem_is_listed(client: TestClient[Litestar]) -> None:
    body = {"prompt": "", "max_tokens": 0, "top_k": -1, "temperature": 99}
    errors = client.post("/generate", json=body).json()["errors"]
    assert sorted(e["loc"] for e in errors) == ["max_tokens", "prompt", "temperature", "top_k"]


def test_boundary_values_are_accepted(client: TestClient[Litestar], model: FakeModel) -> None:
    for extra in (
        {"max_tokens": 1},
        {"max_tokens": 100},
        {"temperature": 0},
        {"temperature": 0.001},
        {"temperature": 10},
        {"top_k": 0},
        {"top_k": 1_000_000},
    ):
        response = client.post("/generate", json={"prompt": "a", **extra} | {"max_tokens": 1})
        assert response.status_code == 200, extra
    assert client.post("/generate", json={"prompt": "q" * 100, "max_tokens": 1}).status_code == 200


def test_prompt_plus_max_tokens_over_the_context_is_413() -> None:
    model = FakeModel(max_positions=128)
    with TestClient(make_app(model)) as client:
        fits = client.post("/generate", json={"prompt": "p" * 100, "max_tokens": 28})
        assert fits.status_code == 200
        over = client.post("/generate", json={"prompt": "p" * 100, "max_tokens": 29})
        assert over.status_code == 413
        assert "context of 128 tokens" in over.json()["detail"]
        assert len(model.calls) == 1
        assert metric(client, "kael_requests_total", status="rejected") == 1


def test_prompt_with_no_tokens_is_422() -> None:
    class DropsSpaces(ByteTokenizer):
        def encode(self, text: str) -> list[int]:
            return [t for t in super().encode(text) if t != ord(" ")]

    with TestClient(make_app(tokenizer=DropsSpaces())) as client:
        response = client.post("/generate", json={"prompt": "   "})
        assert response.status_code == 422
        assert response.json()["detail"] == "the prompt encodes to no tokens"


def test_streaming_request_errors_are_plain_http_errors(client: TestClient[Litestar]) -> None:
    response = client.post("/generate", json={"prompt": "p" * 120, "max_tokens": 20, "stream": True})
    assert response.status_code == 413
    assert response.headers["content-type"].startswith("application/json")
