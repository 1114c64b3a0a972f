"""Tools on ``/v1/chat/completions``: on the bundled kael-tiny-chat, ``tool_choice`` "required"
and a named function generate under the tools' grammar, so every call's arguments validate
(``jsonschema``; the openai client's ``pydantic_function_tool`` + ``parse``), streaming and
not, with finish reason "tool_calls"; a two-turn conversation with a ``tool`` message renders as
transformers' ``apply_chat_template(tools=...)`` does (the prompt's token count); with a
scripted model and a Qwen2.5-style template, "auto" parses the template's ``<tool_call>``
format into ``message.tool_calls`` and ``delta.tool_calls`` chunks; bad tool fields are 400s
naming the field; LangChain's ``bind_tools`` and ``with_structured_output`` work."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from litestar import Litestar
from litestar.testing import TestClient

from kael_server import Generator, create_app

from .conftest import poll_until, sse_payloads
from .fakes import EOT, ByteTokenizer, FakeModel

pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

from kael.tokenizer import ChatTemplate  # noqa: E402
from kael_server.loading import load_app  # noqa: E402

from .test_tool_calls_render import QWEN  # noqa: E402

CHAT_DIR = Path(__file__).resolve().parents[2] / "kael_server" / "src" / "kael_server" / "models" / "kael-tiny-chat"
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"offset": {"type": "integer", "minimum": -12, "maximum": 12}},
    "required": ["offset"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient[Litestar]]:
    with TestClient(load_app(CHAT_DIR)) as c:
        assert poll_until(lambda: c.get("/ready").status_code == 200, timeout=120), c.get("/ready").text
        yield c


@pytest.fixture(scope="module")
def api(client: TestClient[Litestar]) -> Any:
    return openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="unused", http_client=client, max_retries=0)


def _valid(calls: list[tuple[str, str]], only: str | None = None) -> None:
    assert calls
    for name, arguments in calls:
        assert name in SCHEMAS and (only is None or name == only)
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def _streamed_calls(chunks: list[Any]) -> tuple[list[tuple[str, str]], str | None]:
    """The calls a stream's ``delta.tool_calls`` assemble to (name, arguments), and its finish reason."""
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or ():
                if call.id is not None:
                    assert call.index not in names and call.type == "function" and call.function.arguments == ""
                    names[call.index] = call.function.name
                    args[call.index] = ""
                elif call.function is not None and call.function.arguments:
                    args[call.index] += call.function.arguments
    return [(names[i], args[i]) for i in sorted(names)], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_required_and_named_calls_validate_streaming_and_not(api: Any, choice: Any) -> None:
    only = None if choice == "required" else "get_time"
    for seed in range(8):
        kwargs = {"model": "kael-tiny-chat", "messages": USER, "tools": TOOLS, "tool_choice": choice, "seed": seed}
        kwargs |= {"parallel_tool_calls": False, "max_tokens": 200}  # one call: the tiny model never ends a list
        answer = api.chat.completions.create(**kwargs).choices[0]
        assert answer.finish_reason == "tool_calls", answer.message
        calls = [(c.function.name, c.function.arguments) for c in answer.message.tool_calls]
        _valid(calls, only)
        assert len(calls) == 1 and answer.message.content is None
        assert all(c.id.startswith("call_") and c.type == "function" for c in answer.message.tool_calls)
        streamed, finish = _streamed_calls(list(api.chat.completions.create(**kwargs, stream=True)))
        assert finish == "tool_calls"
        assert [(n, json.loads(a)) for n, a in streamed] == [(n, json.loads(a)) for n, a in calls]


def test_parallel_calls_under_required_each_validate(api: Any) -> None:
    finished = 0
    for seed in range(10):
        answer = api.chat.completions.create(
            model="kael-tiny-chat", messages=USER, tools=TOOLS, tool_choice="required", seed=seed, max_tokens=230
        ).choices[0]
        if answer.finish_reason == "length":  # a list of calls cut by max_tokens is no call: the text says so
            assert answer.message.tool_calls is None and answer.message.content.startswith('[{"name":')
            continue
        finished += 1
        assert answer.finish_reason == "tool_calls"
        _valid([(c.function.name, c.function.arguments) for c in answer.message.tool_calls])
    assert finished >= 3


class Lookup(pydantic.BaseModel):
    """Look a word up."""

    word: str = pydantic.Field(max_length=6)
    lang: str = pydantic.Field(pattern="^(en|fr|de)$")
    limit: int = pydantic.Field(ge=1, le=5)


def test_openai_pydantic_function_tool_parses(api: Any) -> None:
    for seed in range(5):
        completion = api.chat.completions.parse(
            model="kael-tiny-chat",
            messages=USER,
            tools=[openai.pydantic_function_tool(Lookup)],
            tool_choice="required",
            parallel_tool_calls=False,
            seed=seed,
            max_tokens=200,
        )
        call = completion.choices[0].message.tool_calls[0]
        assert isinstance(call.function.parsed_arguments, Lookup)


def test_a_two_turn_conversation_with_a_tool_message_renders_as_transformers_does(client: TestClient[Litestar]) -> None:
    transformers = pytest.importorskip("transformers")
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]
    answer = client.post("/v1/chat/completions", json={"messages": messages, "tools": TOOLS, "max_tokens": 2}).json()
    hf = transformers.AutoTokenizer.from_pretrained(CHAT_DIR)
    oracle = [{**m, "content": m["content"] or ""} for m in messages]  # the template concatenates content
    for m in oracle:
        for c in m.get("tool_calls", ()):
            c["function"] = {**c["function"], "arguments": json.loads(c["function"]["arguments"])}
    ids = hf.apply_chat_template(oracle, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    ids = ids if isinstance(ids, list) else ids["input_ids"]
    assert answer["usage"]["prompt_tokens"] == len(ids)


HERMES_REPLY = (
    'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"offset": 1}}\n</tool_call>'
)


@pytest.fixture
def scripted() -> Iterator[tuple[TestClient[Litestar], FakeModel]]:
    model = FakeModel(script=[*HERMES_REPLY.encode(), EOT], max_positions=4096)
    generator = Generator(
        model, ByteTokenizer(), make_rng=random.Random, chat_template=ChatTemplate(QWEN), chat_stop_tokens=[EOT]
    )
    with TestClient(create_app(generator)) as c:
        yield c, model


def test_auto_parses_the_templates_own_format(scripted: tuple[TestClient[Litestar], FakeModel]) -> None:
    transformers = pytest.importorskip("transformers")
    client, model = scripted
    body = {"messages": USER, "tools": TOOLS, "max_tokens": 400, "temperature": 0}
    answer = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=_byte_tokenizer(), chat_template=QWEN)
    rendered = hf.apply_chat_template(USER, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert bytes(model.calls[-1].prompt) == rendered.encode()  # the tools are in the prompt, as transformers puts them
    assert answer["finish_reason"] == "tool_calls"
    assert answer["message"]["content"] == "Checking."
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in answer["message"]["tool_calls"]]
    assert got == [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"offset": 1})]
    events = sse_payloads(client.post("/v1/chat/completions", json={**body, "stream": True}).text)
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "Checking.\n"
    names = [c["function"]["name"] for d in deltas for c in d.get("tool_calls", ()) if "id" in c]
    args: dict[int, str] = {}
    for d in deltas:
        for c in d.get("tool_calls", ()):
            args[c["index"]] = args.get(c["index"], "") + c["function"].get("arguments", "")
    assert [(n, json.loads(args[i])) for i, n in enumerate(names)] == got
    assert [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]][-1] == "tool_calls"
    none = client.post("/v1/chat/completions", json={**body, "tool_choice": "none"}).json()["choices"][0]
    assert none["message"] == {"role": "assistant", "content": HERMES_REPLY} and none["finish_reason"] == "stop"


def test_auto_constrains_a_call_once_the_model_opens_one(api: Any) -> None:
    """kael-tiny-chat's template has no tool format (the generic JSON one): a ``logit_bias``
    pushes the model to open a JSON reply, and from there every call validates, 10 seeds out
    of 10, streaming and not; without the push it answers in plain text."""
    from kael.tokenizer import HFTokenizer

    tok = HFTokenizer.from_directory(CHAT_DIR)
    push = {str(tok.encode(c, add_special_tokens=False)[0]): 100 for c in ("{", "[")}
    for seed in range(10):
        kwargs: dict[str, Any] = {"model": "kael-tiny-chat", "messages": USER, "tools": TOOLS, "max_tokens": 200}
        kwargs["seed"] = seed
        answer = api.chat.completions.create(**kwargs, logit_bias=push).choices[0]
        assert answer.finish_reason == "tool_calls", answer
        _valid([(c.function.name, c.function.arguments) for c in answer.message.tool_calls])
        chunks = list(api.chat.completions.create(**kwargs, logit_bias=push, stream=True))
        calls, finish = _streamed_calls(chunks)
        assert finish == "tool_calls"
        _valid(calls)
        plain = api.chat.completions.create(**kwargs).choices[0]
        assert plain.finish_reason in ("stop", "length") and not plain.message.tool_calls
        assert (plain.message.content or " ").lstrip()[:1] not in ("{", "[")


def test_auto_yields_to_response_format(client: TestClient[Litestar]) -> None:
    """With ``response_format`` the reply is the format's JSON; no call is opened."""
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}
    body = {"messages": USER, "tools": TOOLS, "max_tokens": 200, "seed": 1, "response_format": fmt}
    answer = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert answer["finish_reason"] == "stop" and not answer["message"].get("tool_calls"), answer
    jsonschema.validate(json.loads(answer["message"]["content"]), WEATHER)


def _byte_tokenizer() -> Any:
    from tokenizers import Tokenizer, models

    return Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))


BAD_TOOLS = {
    "not a function": ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    "bad name": ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    "parameters not an object": (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
        "tools[0].function.parameters",
    ),
    "duplicate names": ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
    "required without tools": ({"tool_choice": "required"}, "tool_choice"),
    "bad tool_choice": ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    "unknown function": (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice.function.name",
    ),
    "refused parameters": (
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}],
            "tool_choice": "required",
        },
        "tools",
    ),
    "tool grammar and response_format": (
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
        "response_format",
    ),
    "bad arguments in the history": (
        {
            "messages": [
                *USER,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}],
                },
            ]
        },
        "messages[1].tool_calls[0].function.arguments",
    ),
    "legacy functions": ({"functions": [{"name": "f"}]}, "functions"),
    "legacy function_call": ({"function_call": "auto"}, "function_call"),
}


@pytest.mark.parametrize("case", sorted(BAD_TOOLS))
def test_bad_tool_fields_are_a_400_naming_the_field(client: TestClient[Litestar], case: str) -> None:
    fields, param = BAD_TOOLS[case]
    response = client.post("/v1/chat/completions", json={"messages": USER, **fields, "max_tokens": 2})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()
    assert client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2}).status_code == 200


def test_inert_fields_are_accepted_without_a_warning(client: TestClient[Litestar]) -> None:
    import structlog

    body = {
        "messages": USER,
        "max_tokens": 2,
        "user": "u",
        "metadata": {"a": "b"},
        "store": False,
        "service_tier": "auto",
    }
    with structlog.testing.capture_logs() as logs:
        assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert not [e for e in logs if e["event"] == "unknown_fields_ignored"]


def test_langchain_bind_tools_and_with_structured_output(client: TestClient[Litestar]) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(
        model="kael-tiny-chat",
        base_url=f"{client.base_url}/v1",
        api_key="unused",
        http_client=client,
        max_retries=0,
        seed=3,
        max_tokens=200,
    )
    message = llm.bind_tools(TOOLS, tool_choice="required", parallel_tool_calls=False).invoke("What is the weather?")
    assert message.tool_calls
    for call in message.tool_calls:
        jsonschema.validate(call["args"], SCHEMAS[call["name"]])
    structured = llm.with_structured_output(Lookup, method="json_schema").invoke("Look up a word.")
    assert isinstance(structured, Lookup)
    via_tool = llm.with_structured_output(Lookup, method="function_calling", strict=True).invoke("Look up a word.")
    assert isinstance(via_tool, Lookup)
