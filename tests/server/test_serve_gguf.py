"""``kael-server --data model.gguf``: a GGUF file (model and tokenizer in one) served in-process.

The bundled kael-tiny-chat is exported to GGUF (Q8_0, its tokenizer and chat template in the
metadata); ``/v1/completions`` at temperature 0 must give the text of ``kael.models.generate``
on ``kael.models.load_gguf`` of the same file, ``/v1/chat/completions`` the greedy reply of the
template the file carries, ending at ``<|im_end|>``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kael_server.loading import ServerConfigError, checkpoint_dir, load_app
from litestar import Litestar
from litestar.testing import TestClient

from .conftest import poll_until

kael = pytest.importorskip("kael")

CHAT_DIR = Path(__file__).resolve().parents[2] / "kael_server" / "src" / "kael_server" / "models" / "kael-tiny-chat"
PROMPT = "def fibonacci(n):\n"


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("serve-gguf") / "kael-tiny-chat-q8_0.gguf"
    model = kael.models.from_pretrained(CHAT_DIR)
    kael.models.save_gguf(model, path, kael.tokenizer.load_tokenizer(CHAT_DIR), weights="q8_0")
    return path


@pytest.fixture(scope="module")
def client(gguf_file: Path) -> Iterator[TestClient[Litestar]]:
    with TestClient(load_app(gguf_file)) as c:
        assert poll_until(lambda: c.get("/ready").status_code == 200, timeout=120), c.get("/ready").text
        yield c


def test_completions_are_kaels_greedy_text(client: TestClient[Litestar], gguf_file: Path) -> None:
    model, tokenizer = kael.models.load_gguf(gguf_file)
    assert model.weights_scheme == "q8_0"
    ids = tokenizer.encode(PROMPT)
    new = kael.models.generate(model, ids, 24)
    stop = set(model.generation_config.eos_token_ids) | {tokenizer.eot_token}
    kept = new[: next((i for i, t in enumerate(new) if t in stop), len(new))]
    response = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 24, "temperature": 0})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert body["choices"][0]["text"] == tokenizer.decode_text(kept)
    assert body["model"] == gguf_file.name


def test_chat_uses_the_files_template(client: TestClient[Litestar], gguf_file: Path) -> None:
    model, tokenizer = kael.models.load_gguf(gguf_file)
    messages = [{"role": "user", "content": "Write a Python function `__repr__(self)`."}]
    rendered = tokenizer.chat_template.render(messages, add_generation_prompt=True)
    ids = kael.tokenizer.encode_chat(tokenizer, rendered)
    end = tokenizer.special_tokens["<|im_end|>"]
    new = kael.models.generate(model, ids, 48)
    reply = new[: next((i for i, t in enumerate(new) if t in {end, tokenizer.eot_token}), len(new))]
    response = client.post("/v1/chat/completions", json={"messages": messages, "temperature": 0, "max_tokens": 48})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["usage"]["prompt_tokens"] == len(ids)
    assert answer["choices"][0]["message"]["content"] == tokenizer.decode_text(reply)


def test_data_checks_gguf_paths(tmp_path: Path) -> None:
    with pytest.raises(ServerConfigError, match="no such GGUF file"):
        checkpoint_dir(tmp_path / "missing.gguf")
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    assert checkpoint_dir(tmp_path / "x.gguf") == tmp_path / "x.gguf"


def test_a_file_without_a_tokenizer_fails_to_load(tmp_path: Path) -> None:
    path = tmp_path / "no-vocab.gguf"
    kael.models.save_gguf(kael.models.from_pretrained(CHAT_DIR), path)  # tokenizer.ggml.model "none"
    failures: list[BaseException] = []
    reported = threading.Event()

    def on_error(exc: BaseException) -> None:
        failures.append(exc)
        reported.set()

    with TestClient(load_app(path, on_load_error=on_error)) as c:
        assert reported.wait(60)
        assert c.get("/ready").status_code == 503
    assert isinstance(failures[0], ServerConfigError) and "has no tokenizer" in str(failures[0])
