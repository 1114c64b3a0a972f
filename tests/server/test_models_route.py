"""Model names as OpenAI clients expect them: ``GET /v1/models/{id}`` answers for a served name
(the openai client's ``models.retrieve``), a request naming a model not served is OpenAI's 404
``model_not_found`` (``openai.NotFoundError``) on every generation route, and
``--served-model-name`` (repeatable) sets the names: the first is the default, each is listed,
accepted and echoed in answers, and the directory's own name is then not served."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from kael_server.cli import build_parser
from kael_server.config import ServerConfig
from kael_server.loading import bundled_model_dir, load_app
from litestar import Litestar
from litestar.testing import TestClient

from kael_server import Generator, create_app

from .conftest import poll_until
from .fakes import ByteTokenizer, FakeChatTemplate, FakeModel


@pytest.fixture
def client() -> Iterator[TestClient[Litestar]]:
    generator = Generator(FakeModel(script=b"hello"), ByteTokenizer(), make_rng=random.Random)
    generator.chat_template = FakeChatTemplate()
    with TestClient(create_app(generator)) as c:
        yield c


def _api(client: TestClient[Litestar]) -> Any:
    return openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="unused", http_client=client, max_retries=0)


def test_retrieve_answers_for_the_served_model_and_404s_for_another(client: TestClient[Litestar]) -> None:
    api = _api(client)
    card = api.models.retrieve("kael-gpt2")
    assert (card.id, card.object, card.owned_by) == ("kael-gpt2", "model", "kael")
    assert client.get("/v1/models/kael-gpt2").json() == client.get("/v1/models").json()["data"][0]
    with pytest.raises(openai.NotFoundError) as missing:
        api.models.retrieve("gpt-4o")
    assert missing.value.code == "model_not_found"
    body = client.get("/v1/models/gpt-4o").json()["error"]
    assert body["type"] == "invalid_request_error" and body["param"] == "model" and "kael-gpt2" in body["message"]


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/completions", {"prompt": "a", "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 2}),
    ],
)
def test_a_request_naming_a_model_not_served_is_a_404_model_not_found(
    client: TestClient[Litestar], route: str, body: dict[str, Any]
) -> None:
    response = client.post(route, json={**body, "model": "gpt-4o"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "gpt-4o" not in error["message"]  # the request's value is never repeated
    assert client.post(route, json={**body, "model": "kael-gpt2"}).json()["model"] == "kael-gpt2"
    assert client.post(route, json=body).json()["model"] == "kael-gpt2"  # no model: the served one
    with pytest.raises(openai.NotFoundError):
        if route == "/v1/completions":
            _api(client).completions.create(model="nope", prompt="a", max_tokens=2)
        else:
            _api(client).chat.completions.create(model="nope", messages=body["messages"], max_tokens=2)


def test_served_model_name_sets_the_names_listed_accepted_and_answered() -> None:
    args = build_parser().parse_args(["--served-model-name", "org/tiny", "--served-model-name", "alias"])
    config = ServerConfig.from_args(args)
    assert config.served_model_name == ("org/tiny", "alias")
    with TestClient(load_app(bundled_model_dir(), served_model_name=config.served_model_name)) as c:
        assert poll_until(lambda: c.get("/ready").status_code == 200, timeout=120)
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["org/tiny", "alias"]
        assert c.get("/v1/models/org/tiny").json()["id"] == "org/tiny"  # a name with a slash, as Hugging Face ids
        body = {"prompt": "a", "max_tokens": 2}
        assert c.post("/v1/completions", json=body).json()["model"] == "org/tiny"
        assert c.post("/v1/completions", json={**body, "model": "alias"}).json()["model"] == "alias"
        assert c.post("/v1/completions", json={**body, "model": "kael-tiny"}).status_code == 404
        assert c.get("/v1/models/kael-tiny").status_code == 404
