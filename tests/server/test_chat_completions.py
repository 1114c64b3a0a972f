"""``POST /v1/chat/completions`` with fake models and a fake chat template: the request schema,
the rendered prompt the model receives, stops at end-of-turn tokens, the answer and stream
shapes, logprobs (against a NumPy log-softmax), errors, and the official ``openai`` client.

Real tokenizers, templates and models are in test_chat_models.py.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import openai
import pytest
from kael_server.batching import BatchScheduler
from kael_server.config import ServerConfig
from kael_server.routes.chat import token_bytes
from litestar import Litestar
from litestar.testing import TestClient

from kael_server import Generator, create_app

from .conftest import metric, sse_payloads
from .fake_batch_engine import FakeBatchEngine
from .fakes import END_OF_TURN, EOT, ByteTokenizer, FakeChatTemplate, FakeModel, Gate, fake_logits
from .test_openai import as_httpx

SCRIPT = b"Hi there! How are you?"
USER = [{"role": "user", "content": "Hello"}]
RENDERED_USER = b"[user]Hello\x04[assistant]"


def chat_app(model: FakeModel | None = None, template: Any = None, *, batched: bool = False, **kwargs: Any) -> Litestar:
    scheduler = (lambda g: BatchScheduler(g, FakeBatchEngine(4))) if batched else None
    generator = Generator(
        model or FakeModel(script=SCRIPT),
        ByteTokenizer(),
        make_rng=random.Random,
        chat_template=template if template is not None else FakeChatTemplate(),
        make_scheduler=scheduler,
        **kwargs,
    )
    return create_app(generator)


@pytest.fixture
def model() -> FakeModel:
    return FakeModel(script=SCRIPT, max_positions=256)


@pytest.fixture
def client(model: FakeModel) -> Iterator[TestClient[Litestar]]:
    with TestClient(chat_app(model)) as test_client:
        yield test_client


def chat(client: TestClient[Litestar], **body: Any) -> Any:
    response = client.post("/v1/chat/completions", json={"messages": USER, **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_the_model_continues_the_rendered_conversation(client: TestClient[Litestar], model: FakeModel) -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "again"}]},
        {"role": "assistant", "content": "Hi"},
        {"role": "user", "content": "Bye"},
    ]
    answer = chat(client, messages=messages, max_tokens=8, model="kael-gpt2")
    rendered = b"[system]Be brief.\x04[user]Hello\nagain\x04[assistant]Hi\x04[user]Bye\x04[assistant]"
    assert model.calls[-1].prompt == list(rendered)
    assert model.calls[-1].max_new_tokens == 8
    assert answer["object"] == "chat.completion"
    assert answer["id"].startswith("chatcmpl-")
    assert answer["model"] == "kael-gpt2"
    (choice,) = answer["choices"]
    assert choice == {
        "index": 0,
        "message": {"role": "assistant", "content": SCRIPT[:8].decode()},
        "finish_reason": "length",
        "logprobs": None,
    }
    assert answer["usage"] == {
        "prompt_tokens": len(rendered),
        "completion_tokens": 8,
        "total_tokens": len(rendered) + 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_max_completion_tokens_wins_and_no_limit_fills_the_context(
    client: TestClient[Litestar], model: FakeModel
) -> None:
    chat(client, max_tokens=3, max_completion_tokens=5)
    assert model.calls[-1].max_new_tokens == 5
    chat(client)  # neither: what the context of 256 leaves after the prompt
    assert model.calls[-1].max_new_tokens == 256 - len(RENDERED_USER)
    with TestClient(chat_app(FakeModel(script=SCRIPT, max_positions=4096))) as big:
        chat(big)
        assert big.app.state.server.generator.model.calls[-1].max_new_tokens == 512  # at most MAX_NEW_TOKENS


@pytest.mark.parametrize("end", [END_OF_TURN, EOT])
def test_a_reply_ends_at_end_of_turn_and_end_of_text(end: int) -> None:
    script = [*b"Yes.", end, *b"more"]
    with TestClient(chat_app(FakeModel(script=script))) as client:
        answer = chat(client, max_tokens=20)
        assert answer["choices"][0]["message"]["content"] == "Yes."
        assert answer["choices"][0]["finish_reason"] == "stop"
        assert answer["usage"]["completion_tokens"] == 4
        # /v1/completions ends at end of text only: the end-of-turn byte is text there
        text = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 6}).json()["choices"][0]["text"]
        assert text == ("Yes.\x04m" if end == END_OF_TURN else "Yes.")


def test_generation_config_eos_ids_end_a_reply_too() -> None:
    with TestClient(chat_app(FakeModel(script=b"ab!cd"), stop_tokens=(EOT, ord("!")))) as client:
        answer = chat(client, max_tokens=5)
        assert answer["choices"][0]["message"]["content"] == "ab"


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
def test_stream_sends_role_then_content_then_finish_then_done(batched: bool) -> None:
    with TestClient(chat_app(FakeModel(script=SCRIPT), batched=batched)) as client:
        plain = chat(client, max_tokens=9, n=2, temperature=0)
        response = client.post(
            "/v1/chat/completions",
            json={
                "messages": USER,
                "max_tokens": 9,
                "n": 2,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_payloads(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    usage = chunks.pop()
    assert usage["choices"] == [] and usage["usage"] == plain["usage"]
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert all("role" not in c["delta"] for c in mine[1:])
        assert mine[-1]["delta"] == {} and mine[-1]["finish_reason"] == "length"
        assert all(c["finish_reason"] is None for c in mine[:-1])
        content = "".join(c["delta"].get("content", "") for c in mine)
        assert content == plain["choices"][index]["message"]["content"]
        if not batched:  # FakeBatchEngine decodes greedy letters, not the script
            assert content == SCRIPT[:9].decode()


def test_a_stream_whose_reply_is_empty_still_names_the_role() -> None:
    with TestClient(chat_app(FakeModel(script=[END_OF_TURN]))) as client:
        response = client.post("/v1/chat/completions", json={"messages": USER, "stream": True})
    chunks = sse_payloads(response.text)[:-1]
    assert [c["choices"][0]["delta"] for c in chunks] == [{"role": "assistant", "content": ""}, {}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def oracle_log_softmax(x: np.ndarray) -> np.ndarray:
    m = float(np.max(x))
    return np.array([v - m - math.log(math.fsum(math.exp(w - m) for w in x)) for v in x])


def byte_name(token: int) -> str:
    return chr(token) if token < 128 else f"bytes:\\x{token:02x}"


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
def test_logprobs_in_the_chat_shape_are_the_models(batched: bool) -> None:
    with TestClient(chat_app(FakeModel(), batched=batched)) as client:
        answer = chat(client, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
        streamed = client.post(
            "/v1/chat/completions",
            json={
                "messages": USER,
                "max_tokens": 4,
                "temperature": 0,
                "logprobs": True,
                "top_logprobs": 3,
                "stream": True,
            },
        )
    entries = answer["choices"][0]["logprobs"]["content"]
    context = list(RENDERED_USER)
    for entry in entries:
        logits = fake_logits(context)
        lp = oracle_log_softmax(logits)
        token = int(np.argmax(logits))
        assert entry["token"] == byte_name(token)
        assert entry["bytes"] == [token]
        assert entry["logprob"] == pytest.approx(lp[token], abs=1e-9)
        ranked = np.argsort(-lp, kind="stable")[:3]
        assert [t["token"] for t in entry["top_logprobs"]] == [byte_name(int(t)) for t in ranked]
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx([lp[t] for t in ranked], abs=1e-9)
        assert [t["bytes"] for t in entry["top_logprobs"]] == [[int(t)] for t in ranked]
        context.append(token)
    assert "".join(e["token"] for e in entries) == answer["choices"][0]["message"]["content"]
    chunks = sse_payloads(streamed.text)[:-1]
    streamed_entries = [
        e for c in chunks if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert streamed_entries == entries


def test_logprobs_without_top_logprobs_lists_no_alternatives() -> None:
    with TestClient(chat_app(FakeModel())) as client:  # the fake samples through the sampler
        answer = chat(client, max_tokens=2, logprobs=True, seed=1)
    entries = answer["choices"][0]["logprobs"]["content"]
    assert len(entries) == 2 and all(e["top_logprobs"] == [] for e in entries)


def test_token_bytes_reads_both_spellings() -> None:
    assert token_bytes("é") == [0xC3, 0xA9]
    assert token_bytes("bytes:\\xc3") == [0xC3]
    assert token_bytes("bytes:\\xe2\\x82") == [0xE2, 0x82]


def error_of(client: TestClient[Litestar], body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = client.post("/v1/chat/completions", json=body)
    return response.status_code, response.json()["error"]


@pytest.mark.parametrize(
    ("messages", "param", "words"),
    [
        ([], "messages", "no messages"),
        ([{"role": "function", "content": "x"}], "messages[0].role", "expected one of 'system'"),
        ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id", "expected the id of the tool call"),
        ([{"content": "x"}], "messages[0].role", "field required"),
        ([{"role": "user"}], "messages[0].content", "field required"),
        ([{"role": "user", "content": 3}], "messages[0].content", "expected a string or a list"),
        (
            [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}]}],
            "messages[0].content[1].type",
            "expected 'text', got 'image_url'",
        ),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text", "expected a string"),
        ([{"role": "user", "content": "a", "name": 5}], "messages[0].name", "expected a string"),
        ("hello", "messages", "expected a list"),
    ],
)
def test_bad_messages_are_a_400_naming_the_field(
    client: TestClient[Litestar], model: FakeModel, messages: Any, param: str, words: str
) -> None:
    status, error = error_of(client, {"messages": messages})
    assert status == 400
    assert error["param"] == param
    assert words in error["message"] and error["type"] == "invalid_request_error"
    assert not model.calls


def test_bad_sampling_fields_are_refused_as_for_completions(client: TestClient[Litestar]) -> None:
    assert error_of(client, {"messages": USER, "top_logprobs": 2})[1]["param"] == "top_logprobs"
    assert error_of(client, {"messages": USER, "logprobs": True, "top_logprobs": 21})[1]["param"] == "top_logprobs"
    assert error_of(client, {"messages": USER, "max_completion_tokens": 0})[1]["param"] == "max_completion_tokens"
    zero = error_of(client, {"messages": USER, "max_tokens": 0})[1]
    assert zero["param"] == "max_tokens" and zero["message"] == "max_tokens: expected 1 to 512"
    assert error_of(client, {"messages": USER, "temperature": 11})[1]["param"] == "temperature"
    assert error_of(client, {"messages": USER, "n": 17})[1]["param"] == "n"
    assert error_of(client, {"messages": USER, "logit_bias": {"300": 1}})[1]["param"] == "logit_bias"
    # unknown fields are ignored, as /v1/completions ignores them
    assert chat(client, max_tokens=1, tools=[], response_format={"type": "text"})["choices"]


def test_a_model_without_a_chat_template_is_a_400_saying_how_to_add_one() -> None:
    generator = Generator(FakeModel(script=SCRIPT), ByteTokenizer(), make_rng=random.Random)
    assert generator.chat_template is None
    with TestClient(create_app(generator)) as client:
        status, error = error_of(client, {"messages": USER})
        assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200
    assert status == 400
    assert "no chat template" in error["message"]
    assert "tokenizer_config.json" in error["message"] and "chat_template.jinja" in error["message"]


def test_a_template_that_refuses_is_a_400_with_its_message(client: TestClient[Litestar], model: FakeModel) -> None:
    status, error = error_of(client, {"messages": [{"role": "user", "content": "refuse"}]})
    assert status == 400
    assert error["message"] == "chat_template.jinja: the chat template refused the messages: no refusals"
    assert not model.calls


def test_a_conversation_longer_than_the_context_is_refused(model: FakeModel) -> None:
    with TestClient(chat_app(FakeModel(script=SCRIPT, max_positions=64))) as client:
        long = [{"role": "user", "content": "x" * 60}]
        status, error = error_of(client, {"messages": long})
        assert (status, error["code"]) == (413, "context_length_exceeded")
        assert "leaves no room" in error["message"]
        status, error = error_of(client, {"messages": [{"role": "user", "content": "x" * 30}], "max_tokens": 40})
        assert (status, error["code"]) == (413, "context_length_exceeded")


def test_busy_auth_and_metrics_as_for_completions() -> None:
    gate = Gate()
    with TestClient(chat_app(FakeModel(script=SCRIPT, gate=gate))) as client, ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.post, "/v1/chat/completions", json={"messages": USER, "max_tokens": 2})
        assert gate.wait_arrivals(1)
        busy = client.post("/v1/chat/completions", json={"messages": USER})
        assert busy.status_code == 429 and busy.json()["error"]["type"] == "rate_limit_error"
        gate.open()
        assert first.result(timeout=10).status_code == 200
        assert metric(client, "kael_requests_total", status="busy") == 1
        assert metric(client, "kael_requests_total", status="ok") == 1
    generator = Generator(FakeModel(script=SCRIPT), ByteTokenizer(), chat_template=FakeChatTemplate())
    with TestClient(create_app(generator, ServerConfig(api_keys=("k1",)))) as client:
        assert client.post("/v1/chat/completions", json={"messages": USER}).status_code == 401
        ok = client.post("/v1/chat/completions", json={"messages": USER}, headers={"Authorization": "Bearer k1"})
        assert ok.status_code == 200


def test_the_openapi_document_describes_the_route(client: TestClient[Litestar]) -> None:
    operation = client.get("/schema/openapi.json").json()["paths"]["/v1/chat/completions"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["messages"]["items"]["properties"]["role"]["enum"] == [
        "system",
        "developer",
        "user",
        "assistant",
        "tool",
    ]
    assert "text/event-stream" in operation["responses"]["200"]["content"]


@pytest.fixture
def api(client: TestClient[Litestar]) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{client.base_url}/v1", api_key="unused", http_client=as_httpx(client), max_retries=0
    )


def test_the_openai_client_chats(api: openai.OpenAI, model: FakeModel) -> None:
    reply = api.chat.completions.create(
        model="kael-gpt2", messages=[{"role": "system", "content": "S"}, *USER], max_completion_tokens=6, seed=3
    )
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == SCRIPT[:6].decode()
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 6
    assert model.calls[-1].prompt == list(b"[system]S\x04" + RENDERED_USER)
    stream = api.chat.completions.create(
        model="kael-gpt2", messages=USER, max_tokens=6, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == SCRIPT[:6].decode()
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == len(RENDERED_USER)
    with pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(model="kael-gpt2", messages=[{"role": "user", "content": "refuse"}])
    assert "refused the messages" in str(refused.value)
