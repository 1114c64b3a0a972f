"""``/v1/chat/completions`` on real checkpoints: a random Llama (tokenizer.json, a ChatML template
that writes the BOS, two eos ids in generation_config.json) and a random GPT-2 (vocab.json and
merges.txt, a template in tokenizer_config.json), loaded by ``load_app`` as ``kael-server --data``
loads them; then the official ``openai`` client and langchain's ``ChatOpenAI`` against a running
``kael-server`` process.

Oracles: transformers' ``apply_chat_template`` for the prompt ids (one BOS), and the same
checkpoint loaded in this process, generating greedily with ``kael.models.generate`` on those
ids (transformers' own greedy generation of the Llama agrees with it: test_model_families).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kael_server.loading import load_app
from litestar import Litestar
from litestar.testing import TestClient

from .chat_models import LLAMA_EXTRA_EOS_TEXT, hf_prompt_ids, write_gpt2, write_llama
from .conftest import poll_until, sse_payloads

kael = pytest.importorskip("kael")
pytest.importorskip("transformers")

MESSAGES = [
    {"role": "system", "content": "You are a tiny model."},
    {"role": "user", "content": "Hello world, how are you?"},
    {"role": "assistant", "content": "I am fine, thank you."},
    {"role": "user", "content": "def fibonacci(n):"},
]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama(tmp_path_factory.mktemp("chat") / "tiny-llama")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gpt2(tmp_path_factory.mktemp("chat") / "tiny-gpt2-chat")


@contextlib.contextmanager
def serve(directory: Path, **kwargs: Any) -> Iterator[TestClient[Litestar]]:
    with TestClient(load_app(directory, **kwargs)) as client:
        assert poll_until(lambda: client.get("/ready").status_code == 200, timeout=120), client.get("/ready").text
        yield client


@pytest.fixture(scope="module", params=[1, 2], ids=["single-slot", "slots-2"])
def llama(request: pytest.FixtureRequest, llama_dir: Path) -> Iterator[TestClient[Litestar]]:
    with serve(llama_dir, slots=request.param) as client:
        yield client


def expected_reply(directory: Path, messages: list[dict[str, str]], max_tokens: int) -> tuple[list[int], str, str]:
    """The oracle: the prompt ids, the greedy reply's text and its finish reason."""
    ids = hf_prompt_ids(directory, messages)
    model = kael.models.from_pretrained(directory)
    tokenizer = kael.tokenizer.load_tokenizer(directory)
    stops = {tokenizer.eot_token, *model.generation_config.eos_token_ids}
    stops |= set(tokenizer.chat_template.end_of_turn_tokens(tokenizer))
    new = kael.models.generate(model, ids, max_tokens)
    reply = []
    for token in new:
        if token in stops:
            return ids, tokenizer.decode_text(reply), "stop"
        reply.append(token)
    return ids, tokenizer.decode_text(reply), "length"


def chat(client: TestClient[Litestar], **body: Any) -> Any:
    response = client.post("/v1/chat/completions", json={"messages": MESSAGES, "temperature": 0, **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_llama_chat_is_the_models_greedy_reply(llama: TestClient[Litestar], llama_dir: Path) -> None:
    ids, text, finish = expected_reply(llama_dir, MESSAGES, 12)
    answer = chat(llama, max_tokens=12)
    assert answer["usage"]["prompt_tokens"] == len(ids)
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": text}
    assert answer["choices"][0]["finish_reason"] == finish
    streamed = llama.post(
        "/v1/chat/completions", json={"messages": MESSAGES, "temperature": 0, "max_tokens": 12, "stream": True}
    )
    chunks = sse_payloads(streamed.text)[:-1]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == text


def test_llama_prompt_has_one_bos(llama_dir: Path) -> None:
    ids = hf_prompt_ids(llama_dir, MESSAGES)
    tokenizer = kael.tokenizer.load_tokenizer(llama_dir)
    bos = tokenizer.bos_token_id
    assert ids[0] == bos and ids.count(bos) == 1
    from kael.tokenizer import encode_chat

    assert encode_chat(tokenizer, tokenizer.chat_template.render(MESSAGES)) == ids


def token_id(directory: Path, text: str) -> int:
    return int(kael.tokenizer.load_tokenizer(directory).special_tokens[text])


@pytest.mark.parametrize("end", ["<|im_end|>", LLAMA_EXTRA_EOS_TEXT])
def test_llama_reply_ends_at_each_eos_id(llama: TestClient[Litestar], llama_dir: Path, end: str) -> None:
    """<|im_end|> is the tokenizer's eos and the template's end of turn; <|endoftext|> is only the
    second eos id of generation_config.json. Both end a chat reply and a completion."""
    bias = {str(token_id(llama_dir, end)): 100}
    answer = chat(llama, max_tokens=5, logit_bias=bias)
    assert answer["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": ""},
        "finish_reason": "stop",
        "logprobs": None,
    }
    assert answer["usage"]["completion_tokens"] == 0
    completion = llama.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 5, "logit_bias": bias}).json()
    assert completion["choices"][0]["finish_reason"] == "stop" and completion["choices"][0]["text"] == ""


def test_llama_logprobs_are_the_models(llama: TestClient[Litestar], llama_dir: Path) -> None:
    import numpy as np

    answer = chat(llama, max_tokens=3, logprobs=True, top_logprobs=2)
    entries = answer["choices"][0]["logprobs"]["content"]
    ids = hf_prompt_ids(llama_dir, MESSAGES)
    model = kael.models.from_pretrained(llama_dir)
    tokenizer = kael.tokenizer.load_tokenizer(llama_dir)
    for entry in entries:
        with kael.no_grad():
            logits = np.asarray(model(kael.tensor([ids])).numpy()[0, -1], dtype=np.float64)
        lp = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        token = int(np.argmax(lp))
        assert entry["logprob"] == pytest.approx(lp[token], abs=1e-4)
        assert bytes(entry["bytes"]) == tokenizer.token_bytes(token)
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx(sorted(lp)[::-1][:2], abs=1e-4)
        ids.append(token)


def test_a_long_conversation_is_refused_before_generating(llama: TestClient[Litestar]) -> None:
    long = [{"role": "user", "content": "Hello world, " * 200}]
    response = llama.post("/v1/chat/completions", json={"messages": long})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_gpt2_with_a_template_chats(gpt2_dir: Path) -> None:
    ids, text, finish = expected_reply(gpt2_dir, MESSAGES, 10)
    with serve(gpt2_dir) as client:
        answer = chat(client, max_tokens=10)
        assert answer["usage"]["prompt_tokens"] == len(ids)
        assert answer["choices"][0]["message"]["content"] == text
        assert answer["choices"][0]["finish_reason"] == finish


def test_gpt2_without_a_template_is_a_400_and_completions_still_work(tmp_path: Path) -> None:
    directory = write_gpt2(tmp_path / "plain-gpt2")
    (directory / "tokenizer_config.json").unlink()
    with serve(directory) as client:
        response = client.post("/v1/chat/completions", json={"messages": MESSAGES})
        assert response.status_code == 400
        message = response.json()["error"]["message"]
        assert "has no chat template" in message and "chat_template.jinja" in message
        assert client.post("/v1/completions", json={"prompt": "a", "max_tokens": 2}).status_code == 200


def test_chat_template_jinja_file_is_used(tmp_path: Path) -> None:
    directory = write_gpt2(tmp_path / "jinja-gpt2")
    (directory / "tokenizer_config.json").unlink()
    (directory / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}> ")
    with serve(directory) as client:
        answer = chat(client, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        assert answer["usage"]["prompt_tokens"] == len(b"[hi]> ")


def test_a_template_raise_exception_is_a_400_with_its_message(tmp_path: Path) -> None:
    directory = write_gpt2(tmp_path / "strict-gpt2")
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('start with a user message') }}{% endif %}x"
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    with serve(directory) as client:
        response = client.post("/v1/chat/completions", json={"messages": MESSAGES})
        assert response.status_code == 400
        message = response.json()["error"]["message"]
        assert "start with a user message" in message
        assert str(tmp_path) not in message  # the template's file by name, not the server's path


# ---- a running kael-server and real clients ------------------------------------------------


@pytest.fixture(scope="module")
def process(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from .test_openai_clients import kael_server

    with kael_server(tmp_path_factory.mktemp("chatlog"), "--data", str(llama_dir), "--slots", "2") as served:
        yield served


@pytest.mark.e2e
def test_openai_client_against_kael_server(process: Any, llama_dir: Path) -> None:
    messages: Any = MESSAGES
    ids, text, finish = expected_reply(llama_dir, MESSAGES, 8)
    reply = process.api.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=8, temperature=0)
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == text
    assert reply.choices[0].finish_reason == finish
    assert reply.usage is not None and reply.usage.prompt_tokens == len(ids)
    stream = process.api.chat.completions.create(
        model="tiny-llama",
        messages=messages,
        max_completion_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    sampled = [
        process.api.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=6, seed=5, n=2)
        for _ in range(2)
    ]
    assert [c.message.content for c in sampled[0].choices] == [c.message.content for c in sampled[1].choices]


@pytest.mark.e2e
def test_langchain_chat_openai_against_kael_server(process: Any, llama_dir: Path) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    _, text, _ = expected_reply(llama_dir, MESSAGES[:2], 8)
    llm = langchain_openai.ChatOpenAI(
        base_url=f"{process.url}/v1", api_key="unused", model="tiny-llama", temperature=0, max_tokens=8, max_retries=0
    )
    answer = llm.invoke([("system", MESSAGES[0]["content"]), ("human", MESSAGES[1]["content"])])
    assert answer.content == text
    streamed = "".join(
        str(chunk.content)
        for chunk in llm.stream([("system", MESSAGES[0]["content"]), ("human", MESSAGES[1]["content"])])
    )
    assert streamed == text


@pytest.mark.e2e
def test_chat_on_the_cuda_backend(llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kael-server --device cuda`` (the CuPy backend, in host emulation here) answers as the CPU does."""
    pytest.importorskip("kael_backend_cuda")
    from .test_openai_clients import kael_server

    _, text, finish = expected_reply(llama_dir, MESSAGES, 8)
    monkeypatch.setenv("KAEL_CUDA_EMULATE", "1")  # the server process's environment (a real GPU needs none)
    with kael_server(tmp_path, "--data", str(llama_dir), "--device", "cuda") as served:
        monkeypatch.delenv("KAEL_CUDA_EMULATE")
        reply = served.api.chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=8, temperature=0)
    assert reply.choices[0].message.content == text
    assert reply.choices[0].finish_reason == finish
