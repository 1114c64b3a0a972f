"""``python -m kael generate/chat --model NAME`` with the models kael-server bundles (kael/models/_cli.py's
``resolve_model`` over the ``kael_bundled_models`` hook): the same directories ``kael-server --data NAME``
serves, greedy text equal to transformers' on them, and an unknown name still a clean error.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from kael.__main__ import main
from kael.models._cli import bundled_models, resolve_model

kael_server_loading = pytest.importorskip("kael_server.loading")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_the_names_resolve_to_the_directories_kael_server_serves() -> None:
    names = bundled_models()
    assert set(names) == set(kael_server_loading.BUNDLED_MODELS)
    for name in kael_server_loading.BUNDLED_MODELS:
        expected = kael_server_loading.checkpoint_dir(name)
        assert Path(resolve_model(name)).resolve() == expected.resolve()


def test_an_existing_path_wins_over_a_bundled_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kael-tiny").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_model("kael-tiny") == "kael-tiny"
    assert resolve_model("no-such-model") == "no-such-model"


def _hf_greedy(directory: Path, ids: list[int], n: int) -> list[int]:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None)
    return [int(t) for t in out[0, len(ids) :]]


def test_generate_by_name_is_transformers_greedy_text(capsys: pytest.CaptureFixture[str]) -> None:
    directory = kael_server_loading.checkpoint_dir("kael-tiny")
    tokenizer = transformers.GPT2TokenizerFast.from_pretrained(directory)
    prompt = "Hello world"
    expected = tokenizer.decode(_hf_greedy(directory, tokenizer.encode(prompt), 12))
    assert main(["generate", "--model", "kael-tiny", prompt, "--max-tokens", "12", "--temperature", "0"]) == 0
    by_name = capsys.readouterr().out
    assert main(["generate", "--model", str(directory), prompt, "--max-tokens", "12", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == by_name
    assert by_name.rstrip("\n") == expected.split("<|endoftext|>")[0]


def test_chat_by_name_replies_as_with_the_directory(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = kael_server_loading.checkpoint_dir("kael-tiny-chat")
    replies = []
    for model in ("kael-tiny-chat", str(directory)):
        monkeypatch.setattr("sys.stdin", io.StringIO("Hi there\nWhat is 2+2?\n"))
        assert main(["chat", "--model", model, "--max-tokens", "8", "--temperature", "0"]) == 0
        replies.append(capsys.readouterr().out)
    assert replies[0] == replies[1]
    assert replies[0].strip()


def test_an_unknown_name_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--model", "kael-huge", "Hi"]) == 1
    err = capsys.readouterr().err
    assert "error:" in err and "kael-huge" in err
