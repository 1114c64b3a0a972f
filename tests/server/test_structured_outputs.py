"""Structured outputs on the bundled kael-tiny-chat model (its text is poor; the constraint must
hold): the official openai client's ``chat.completions.parse`` with a pydantic model validates
for 20 seeds, streaming and not (pydantic is the oracle); ``json_object`` parses
(``json.loads``); vLLM's ``structured_outputs`` / ``guided_*`` and llama.cpp's ``json_schema`` /
``grammar`` on both routes match (``re.fullmatch``, ``jsonschema``); a schema the library
refuses, a 5 MB schema, a schema nested over the depth limit, a malformed grammar, two
constraints at once and ``min_tokens`` with a constraint are each a 400 naming the field, and
the server then answers a normal request; a reply cut at ``max_tokens`` says "length"; the
metrics count masks, compiles, cache hits and refusals; batched (``--slots 4``) equals alone."""

from __future__ import annotations

import concurrent.futures
import enum
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import jsonschema
import pytest
from litestar import Litestar
from litestar.testing import TestClient

from .conftest import poll_until, samples, sse_payloads

pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

from kael_server.field_policy import INERT, NEUTRAL, UNSUPPORTED  # noqa: E402
from kael_server.loading import load_app  # noqa: E402

CHAT_DIR = Path(__file__).resolve().parents[2] / "kael_server" / "src" / "kael_server" / "models" / "kael-tiny-chat"
USER = [{"role": "user", "content": "Describe a pet as JSON."}]


class Kind(str, enum.Enum):
    cat = "cat"
    dog = "dog"
    fish = "fish"


class Owner(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    age: int = pydantic.Field(ge=18, le=99)


class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=10)
    kind: Kind
    legs: int = pydantic.Field(ge=0, le=8)
    vaccinated: bool
    tags: list[Annotated[str, pydantic.Field(max_length=5)]] = pydantic.Field(max_length=3)
    owner: Owner
    nickname: str | None = pydantic.Field(max_length=6)


def _app(slots: int = 1) -> Litestar:
    return load_app(CHAT_DIR, slots=slots)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient[Litestar]]:
    with TestClient(_app()) as c:
        assert poll_until(lambda: c.get("/ready").status_code == 200, timeout=120), c.get("/ready").text
        yield c


@pytest.fixture(scope="module")
def api(client: TestClient[Litestar]) -> Any:
    return openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="unused", http_client=client, max_retries=0)


def test_parse_with_a_pydantic_model_validates_for_20_seeds(api: Any) -> None:
    for seed in range(20):
        completion = api.chat.completions.parse(
            model="kael-tiny-chat", messages=USER, response_format=Pet, seed=seed, temperature=1.0, max_tokens=230
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, Pet)  # pydantic validated it
        Pet.model_validate_json(choice.message.content)


def test_streamed_parse_validates_for_20_seeds(api: Any) -> None:
    for seed in range(20):
        with api.chat.completions.stream(
            model="kael-tiny-chat", messages=USER, response_format=Pet, seed=seed, temperature=1.0, max_tokens=230
        ) as stream:
            final = stream.get_final_completion()
        assert isinstance(final.choices[0].message.parsed, Pet), final.choices[0].message.content


def test_json_object_parses_and_a_cut_reply_says_length(client: TestClient[Litestar]) -> None:
    stopped = 0
    for seed in range(6):
        body = {"messages": USER, "response_format": {"type": "json_object"}, "seed": seed, "max_tokens": 120}
        choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(choice["message"]["content"]), dict)
            stopped += 1
        else:
            assert choice["finish_reason"] == "length"
    assert stopped
    cut = {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {}}}}
    choice = client.post("/v1/chat/completions", json={**cut, "max_tokens": 2, "seed": 1}).json()["choices"][0]
    assert choice["finish_reason"] == "length"


REGEX = r"[a-c]{2}-[0-9]{3}"
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"}},
    "required": ["n", "ok"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("fields", "check"),
    [
        ({"structured_outputs": {"regex": REGEX}}, lambda t: re.fullmatch(REGEX, t)),
        ({"guided_regex": REGEX}, lambda t: re.fullmatch(REGEX, t)),
        ({"structured_outputs": {"choice": ["alpha", "beta"]}}, lambda t: t in ("alpha", "beta")),
        ({"guided_choice": ["alpha", "beta"]}, lambda t: t in ("alpha", "beta")),
        ({"structured_outputs": {"json": SCHEMA}}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
        ({"guided_json": json.dumps(SCHEMA)}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
        ({"json_schema": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
        ({"grammar": 'root ::= "yes" | "no" | "maybe"'}, lambda t: t in ("yes", "no", "maybe")),
        ({"guided_grammar": 'start: /[0-9]{1,4}/ "!"'}, lambda t: re.fullmatch(r"[0-9]{1,4}!", t)),
        ({"structured_outputs": {"grammar": 'start: "x" | "y"'}}, lambda t: t in ("x", "y")),
    ],
)
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_vllm_and_llama_cpp_fields_constrain_both_routes(
    client: TestClient[Litestar], route: str, fields: dict[str, Any], check: Any
) -> None:
    base = {"prompt": "Answer:"} if route == "/v1/completions" else {"messages": USER}
    for seed in range(3):
        response = client.post(route, json={**base, **fields, "seed": seed, "max_tokens": 60})
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        assert choice["finish_reason"] == "stop" and check(text), text


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


BIG = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(50_000)}}

REFUSED = {
    "unknown type": (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
        "response_format.json_schema.schema",
        "Invalid type",
    ),
    "unsatisfiable": (
        {"structured_outputs": {"json": {"type": "integer", "minimum": 5, "maximum": 1}}},
        "structured_outputs.json",
        "minimum",
    ),
    "5 MB schema": ({"json_schema": BIG}, "json_schema", "at most 1048576 allowed"),
    "too deep": ({"guided_json": _deep(40)}, "guided_json", "at most 32 allowed"),
    "malformed GBNF": ({"grammar": "root ::= ( 'a'"}, "grammar", "invalid GBNF grammar"),
    "malformed Lark": ({"guided_grammar": "start: ( ("}, "guided_grammar", "invalid"),
    "bad regex": ({"guided_regex": "(?=a)b"}, "guided_regex", "look-around"),
    "bad response_format": ({"response_format": {"type": "xml"}}, "response_format.type", "expected 'text'"),
    "two constraints": (
        {"response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'},
        "response_format",
        "only one constraint per request, got response_format and grammar",
    ),
    "min_tokens": ({"guided_choice": ["a"], "min_tokens": 2}, "min_tokens", "cannot be combined with a constraint"),
    "not a schema": ({"json_schema": "nope"}, "json_schema", "expected a JSON object"),
    "another kind of structured output": (
        {"structured_outputs": {"structural_tag": "{}"}},
        "structured_outputs.structural_tag",
        "not supported",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_constraint_kael_cannot_enforce_is_a_400_naming_the_field_and_the_server_stays_healthy(
    client: TestClient[Litestar], case: str
) -> None:
    fields, param, words = REFUSED[case]
    for route, base in (("/v1/completions", {"prompt": "a"}), ("/v1/chat/completions", {"messages": USER})):
        response = client.post(route, json={**base, **fields, "max_tokens": 4})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and words in error["message"], error
        assert error["type"] == "invalid_request_error"
        ok = client.post(route, json={**base, "max_tokens": 2, "temperature": 0})
        assert ok.status_code == 200


def test_metrics_count_masks_compiles_cache_hits_and_refusals() -> None:
    with TestClient(_app()) as c:
        assert poll_until(lambda: c.get("/ready").status_code == 200, timeout=120)
        body = {"prompt": "a", "guided_choice": ["yes", "no"], "max_tokens": 8, "seed": 0}
        tokens = sum(c.post("/v1/completions", json=body).json()["usage"]["completion_tokens"] for _ in range(2))
        assert c.post("/v1/completions", json={"prompt": "a", "grammar": "root ::= ("}).status_code == 400
        assert c.post("/v1/completions", json={"prompt": "a", "json_schema": {"type": "x"}}).status_code == 400
        got = samples(c.get("/metrics").text)
    assert got[("kael_constraint_compile_seconds_count", ())] == 1  # the first request compiled it
    assert got[("kael_constraint_compile_cache_hits_total", ())] == 1  # the second found it
    assert got[("kael_constraint_mask_seconds_count", ())] == tokens + 2  # each step, the end token's too
    assert got[("kael_constraint_refusals_total", (("reason", "invalid"),))] == 1
    assert got[("kael_constraint_refusals_total", (("reason", "compile"),))] == 1


def test_batched_equals_alone_for_a_seeded_constrained_request(client: TestClient[Litestar]) -> None:
    body = {
        "messages": USER,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
    }
    bodies = [{**body, "seed": s, "n": 2, "max_tokens": 60} for s in range(3)]
    alone = [
        [c["message"]["content"] for c in client.post("/v1/chat/completions", json=b).json()["choices"]] for b in bodies
    ]
    with TestClient(_app(slots=4)) as batched:
        assert poll_until(lambda: batched.get("/ready").status_code == 200, timeout=120)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda b: batched.post("/v1/chat/completions", json=b).json(), bodies))
    together = [[c["message"]["content"] for c in a["choices"]] for a in answers]
    assert together == alone
    for texts in alone:
        for text in texts:
            jsonschema.validate(json.loads(text), SCHEMA)


def test_streamed_constrained_completion_is_the_plain_one(client: TestClient[Litestar]) -> None:
    body = {"prompt": "Answer:", "guided_json": SCHEMA, "seed": 4, "max_tokens": 60}
    plain = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    events = sse_payloads(client.post("/v1/completions", json={**body, "stream": True}).text)
    streamed = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
    assert streamed == plain
    jsonschema.validate(json.loads(plain), SCHEMA)


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_each_unsupported_generation_field_is_a_400_naming_it(client: TestClient[Litestar], name: str) -> None:
    for route, base in (("/v1/completions", {"prompt": "a"}), ("/v1/chat/completions", {"messages": USER})):
        response = client.post(route, json={**base, name: 7, "max_tokens": 2})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == name and UNSUPPORTED[name] in error["message"]
    null = client.post("/v1/completions", json={"prompt": "a", name: None, "max_tokens": 2})
    assert null.status_code == 200  # null asks for nothing
    for neutral in NEUTRAL.get(name, ()):  # what kael does anyway, as llama.cpp's and vLLM's clients send it
        response = client.post("/v1/chat/completions", json={"messages": USER, name: neutral, "max_tokens": 2})
        assert response.status_code == 200, (name, neutral)
    flags = [n for n in NEUTRAL.get(name, ()) if isinstance(n, bool)]
    for flag in flags:  # a number is no flag: 0 is not False, 1 is not True
        assert client.post("/v1/completions", json={"prompt": "a", name: int(flag), "max_tokens": 2}).status_code == 400


def test_the_readme_table_lists_the_field_policy() -> None:
    readme = (Path(__file__).resolve().parents[2] / "kael_server" / "README.md").read_text(encoding="utf-8")
    (row,) = [line for line in readme.splitlines() if line.startswith("| `functions`")]
    refused, inert = row.strip("|").split(" | ")
    assert set(re.findall(r"`([a-z_]+)`", refused)) - {"tools", "tool_choice"} == set(UNSUPPORTED)
    assert set(re.findall(r"`([a-z_]+)`", inert)) == INERT
