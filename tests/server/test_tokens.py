"""POST /tokenize and /detokenize."""

from __future__ import annotations

from litestar import Litestar
from litestar.testing import TestClient


def test_tokenize(client: TestClient[Litestar]) -> None:
    response = client.post("/tokenize", json={"prompt": "hé"})
    assert response.status_code == 200
    assert response.json() == {"tokens": [104, 0xC3, 0xA9], "count": 3, "max_model_len": 128}


def test_detokenize_round_trip_and_replacement(client: TestClient[Litestar]) -> None:
    assert client.post("/detokenize", json={"tokens": [104, 0xC3, 0xA9]}).json() == {"prompt": "hé"}
    assert client.post("/detokenize", json={"tokens": [104, 0xC3]}).json() == {"prompt": "h\ufffd"}
    assert client.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}


def test_detokenize_refuses_ids_outside_the_vocabulary(client: TestClient[Litestar]) -> None:
    for tokens in ([257], [-1], ["a"], [1.5]):
        response = client.post("/detokenize", json={"tokens": tokens})
        assert response.status_code == 422, tokens
        assert response.json()["errors"][0]["loc"] == "tokens"


def test_tokenize_validates(client: TestClient[Litestar]) -> None:
    assert client.post("/tokenize", json={"prompt": ""}).status_code == 422
    assert client.post("/tokenize", json={"text": "a"}).status_code == 422
