"""The bundled kael-tiny-chat model (kael_server/models/kael-tiny-chat/, trained by
examples/train_llama.py): transformers loads the directory and gives kael's logits within 1e-4
and the same chat-template ids; kael-server answers ``/v1/chat/completions`` with the model's
greedy reply, which ends at ``<|im_end|>`` (generation_config.json's first eos id).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from kael_server.loading import load_app
from litestar import Litestar
from litestar.testing import TestClient

from .chat_models import hf_prompt_ids
from .conftest import poll_until

kael = pytest.importorskip("kael")

CHAT_DIR = Path(__file__).resolve().parents[2] / "kael_server" / "src" / "kael_server" / "models" / "kael-tiny-chat"
MESSAGES = [{"role": "user", "content": "Write a Python function `__repr__(self)`."}]


def test_the_directory_is_a_small_grouped_query_llama() -> None:
    config = json.loads((CHAT_DIR / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] < config["num_attention_heads"]
    model = kael.models.from_pretrained(CHAT_DIR)
    assert type(model).__name__ == "LlamaForCausalLM"
    tokenizer = kael.tokenizer.load_tokenizer(CHAT_DIR)
    ids = model.generation_config.eos_token_ids
    assert ids == (tokenizer.special_tokens["<|im_end|>"], tokenizer.special_tokens["<|endoftext|>"])
    assert (CHAT_DIR / "model.safetensors").stat().st_size < 8_000_000
    readme = (CHAT_DIR / "README.md").read_text()
    assert "held-out loss" in readme and "examples/train_llama.py" in readme


def test_transformers_agrees() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ids = hf_prompt_ids(CHAT_DIR, MESSAGES)
    tokenizer = kael.tokenizer.load_tokenizer(CHAT_DIR)
    assert tokenizer.encode(tokenizer.chat_template.render(MESSAGES, add_generation_prompt=True)) == ids
    hf = transformers.AutoModelForCausalLM.from_pretrained(CHAT_DIR).eval()
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits.numpy()
    with kael.no_grad():
        got = kael.models.from_pretrained(CHAT_DIR)(kael.tensor([ids])).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient[Litestar]]:
    pytest.importorskip("transformers")
    with TestClient(load_app(CHAT_DIR)) as c:
        assert poll_until(lambda: c.get("/ready").status_code == 200, timeout=120), c.get("/ready").text
        yield c


def test_chat_completions_answer_is_the_greedy_reply(client: TestClient[Litestar]) -> None:
    ids = hf_prompt_ids(CHAT_DIR, MESSAGES)
    model = kael.models.from_pretrained(CHAT_DIR)
    tokenizer = kael.tokenizer.load_tokenizer(CHAT_DIR)
    eos = set(model.generation_config.eos_token_ids)
    new = kael.models.generate(model, ids, 64)
    reply = new[: next((i for i, t in enumerate(new) if t in eos), len(new))]
    finish = "stop" if len(reply) < len(new) else "length"
    response = client.post("/v1/chat/completions", json={"messages": MESSAGES, "temperature": 0, "max_tokens": 64})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["usage"]["prompt_tokens"] == len(ids)
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": tokenizer.decode_text(reply)}
    assert answer["choices"][0]["finish_reason"] == finish


def test_data_names_the_bundled_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kael_server.loading import BUNDLED_MODELS, ServerConfigError, bundled_model_dir, checkpoint_dir

    monkeypatch.chdir(tmp_path)  # no directory called kael-tiny-chat here
    assert BUNDLED_MODELS == ("kael-tiny", "kael-tiny-chat")
    assert checkpoint_dir("kael-tiny-chat").resolve() == CHAT_DIR.resolve()
    assert checkpoint_dir("kael-tiny") == bundled_model_dir()
    (tmp_path / "kael-tiny-chat").mkdir()  # a directory of that name wins, and is checked as a checkpoint
    with pytest.raises(ServerConfigError, match="lacks config.json"):
        checkpoint_dir("kael-tiny-chat")
    with pytest.raises(ServerConfigError, match="no bundled model is called 'nope'"):
        bundled_model_dir("nope")
