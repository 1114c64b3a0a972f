"""Tests for kael.tokenizer's HFTokenizer files and ``load_tokenizer``: tokenizer_config.json's switches as
transformers reads them (BOS/EOS, added and special tokens, special_tokens_map.json, the end-of-text
fallback), malformed tokenizer.json and tokenizer_config.json files as FormatErrors (and a file the tokenizers
library cannot run, or whose token ids reach far beyond its vocabulary), ``from_bytes`` against
``from_directory``, and ``load_tokenizer`` picking the format and attaching the chat template. The oracle is
``transformers.AutoTokenizer.from_pretrained(directory)`` on tokenizer directories built offline
(``hf_fixtures``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from hf_fixtures import GPT2_DATA, write_byte_level, write_config, write_llama2  # noqa: E402
from hf_tokenizer_common import KINDS, TEXTS, write_tokenizer_dirs  # noqa: E402
from hf_tokenizer_common import auto_tokenizer as _auto  # noqa: E402
from hf_tokenizer_common import quiet_decode as _quiet_decode  # noqa: E402
from kael import FormatError, KaelError  # noqa: E402
from kael.tokenizer import BpeTokenizer, HFTokenizer, load_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_tokenizer_dirs(tmp_path_factory.mktemp("hf-tokenizers"))


# -- tokenizer_config.json switches, as transformers reads them -------------------------------


@pytest.mark.parametrize(
    ("kind", "config"),
    [
        ("llama2", {"add_bos_token": False}),
        ("llama2", {"add_bos_token": True, "add_eos_token": True}),
        ("llama3", {"add_bos_token": False, "add_eos_token": True}),
        ("byte_level", {"add_bos_token": True}),
        ("byte_level", {"bos_token": None, "add_bos_token": True}),
        ("byte_level", {"additional_special_tokens": ["<tool>", "</tool>"]}),
        ("llama2", {"extra_special_tokens": ["<tool>", "<|im_end|>"]}),
        ("llama3", {"eos_token": {"__type": "AddedToken", "content": "<|end_of_text|>", "special": True}}),
        (
            "byte_level",
            {
                "added_tokens_decoder": {
                    "0": {"content": "<|endoftext|>", "special": True},
                    "420": {"content": "<think>", "special": False, "normalized": False},
                    "421": {"content": "<|fim|>", "special": True},
                }
            },
        ),
    ],
)
def test_config_switches_match_transformers(tmp_path: Path, kind: str, config: dict[str, Any]) -> None:
    directory = KINDS[kind](tmp_path / kind, **config)
    tok, hf = HFTokenizer.from_directory(directory), _auto(directory)
    assert tok.vocab_size == len(hf)
    assert tok.eos_token_id == hf.eos_token_id and tok.bos_token_id == hf.bos_token_id
    for text in ["Hello world", "a <tool>x</tool> <think>y <|fim|>", "<s>hi</s>", " <|im_end|>z"]:
        for add in (True, False):
            ids = tok.encode(text, add_special_tokens=add)
            assert ids == hf(text, add_special_tokens=add)["input_ids"], (text, add)
            assert tok.decode_text(ids) == _quiet_decode(hf, ids)


def test_add_bos_and_eos_switches_leave_the_post_processor_alone(tmp_path: Path) -> None:
    # transformers 5 ignores add_bos_token/add_eos_token when there is a tokenizer.json
    directory = write_llama2(tmp_path / "a")
    plain = HFTokenizer.from_directory(directory)
    write_config(directory, bos_token="<s>", eos_token="</s>", add_bos_token=False, add_eos_token=True)
    switched = HFTokenizer.from_directory(directory)
    assert plain.encode("Hello") == switched.encode("Hello") == [1, *plain.encode("Hello", add_special_tokens=False)]


def test_special_tokens_map_is_read_without_added_tokens_decoder(tmp_path: Path) -> None:
    directory = write_byte_level(tmp_path / "b", eos_token="<|endoftext|>")
    (directory / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|im_end|>", "bos_token": None}))
    tok, hf = HFTokenizer.from_directory(directory), _auto(directory)
    assert tok.eos_token == hf.eos_token == "<|im_end|>"
    assert tok.eos_token_id == hf.eos_token_id == 2


def test_eot_token_falls_back_to_endoftext_then_raises(tmp_path: Path) -> None:
    directory = write_byte_level(tmp_path / "b", eos_token=None, bos_token=None, pad_token=None)
    tok = HFTokenizer.from_directory(directory)
    assert tok.eos_token is None and tok.eos_token_id is None and tok.bos_token_id is None
    assert tok.eot_token == 0  # <|endoftext|>
    no_eot = write_llama2(tmp_path / "l", eos_token=None)
    tok2 = HFTokenizer.from_directory(no_eot)
    with pytest.raises(KaelError, match=r"no end-of-text token: no eos_token in tokenizer_config.json"):
        _ = tok2.eot_token


# -- malformed files ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", r"tokenizer.json: not valid JSON"),
        (b"\xff\xfe", r"tokenizer.json: not valid UTF-8 at byte 0"),
        (b"[1, 2]", r"tokenizer.json: expected a JSON object, got list"),
        (b"{}", r"tokenizer.json: expected a 'model' object"),
        (b'{"model": {"type": "BPE", "vocab": 3}}', r"tokenizer.json: not a valid tokenizers file"),
        (b'{"model": {"type": "Nope"}}', r"tokenizer.json: not a valid tokenizers file"),
    ],
)
def test_malformed_tokenizer_json_is_a_format_error(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "tokenizer.json").write_bytes(content)
    with pytest.raises(FormatError, match=message):
        HFTokenizer.from_directory(tmp_path)
    with pytest.raises(FormatError, match=message):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"bos_token": 3}, r"tokenizer_config.json: bos_token must be a string or an AddedToken object, got int"),
        ({"eos_token": ""}, r"tokenizer_config.json: eos_token must not be the empty string"),
        ({"eos_token": {"content": 5}}, r"eos_token needs a non-empty string 'content', got 5"),
        ({"eos_token": {"content": "x", "lstrip": "no"}}, r"eos_token.lstrip must be true or false, got 'no'"),
        ({"added_tokens_decoder": []}, r"added_tokens_decoder must be an object of id -> token, got list"),
        ({"added_tokens_decoder": {"x": "<a>"}}, r"added_tokens_decoder keys must be integer ids, got 'x'"),
        ({"added_tokens_decoder": {"-2": "<a>"}}, r"added_tokens_decoder ids must be >= 0, got -2"),
        ({"additional_special_tokens": "<a>"}, r"additional_special_tokens must be a list of tokens, got str"),
        ({"chat_template": 5}, r"chat_template must be a string or a list of \{name, template\}, got int"),
        ({"chat_template": [{"name": "tool_use", "template": "x"}]}, r"no template named 'default'"),
        ({"chat_template": "{% if %}"}, r"tokenizer_config.json chat_template, line 1: the chat template does not"),
    ],
)
def test_malformed_tokenizer_config_is_a_format_error(tmp_path: Path, config: dict[str, Any], message: str) -> None:
    directory = write_byte_level(tmp_path / "b")
    write_config(directory, **config)
    with pytest.raises(FormatError, match=message):
        HFTokenizer.from_directory(directory)


def test_a_file_the_library_cannot_run_fails_at_load(dirs: dict[str, Path]) -> None:
    raw = json.loads((dirs["llama2"] / "tokenizer.json").read_text(encoding="utf-8"))
    # the post-processor adds "<s>", but its special_tokens table names another token
    raw["post_processor"]["special_tokens"] = {"<x>": {"id": "<x>", "ids": [1], "tokens": ["<x>"]}}
    with pytest.raises(FormatError, match=r"tokenizer.json: encode: the tokenizers library cannot run this file"):
        HFTokenizer.from_bytes(json.dumps(raw).encode())
    # ... or adds an id that is no token
    raw = json.loads((dirs["llama2"] / "tokenizer.json").read_text(encoding="utf-8"))
    raw["post_processor"]["special_tokens"]["<s>"]["ids"] = [10**6]
    with pytest.raises(FormatError, match=r"tokenizer.json: encode gave the id 1000000, which stands for no token"):
        HFTokenizer.from_bytes(json.dumps(raw).encode())


def test_config_that_is_not_an_object_or_not_json(tmp_path: Path) -> None:
    directory = write_byte_level(tmp_path / "b")
    (directory / "tokenizer_config.json").write_text("[]")
    with pytest.raises(FormatError, match=r"tokenizer_config.json: expected a JSON object, got list"):
        HFTokenizer.from_directory(directory)
    (directory / "tokenizer_config.json").write_text('{"a": ')
    with pytest.raises(FormatError, match=r"tokenizer_config.json: not valid JSON"):
        HFTokenizer.from_directory(directory)


def test_from_bytes_equals_from_directory(dirs: dict[str, Path]) -> None:
    directory = dirs["llama2"]
    config = (directory / "tokenizer_config.json").read_bytes()
    tok = HFTokenizer.from_bytes((directory / "tokenizer.json").read_bytes(), config)
    ref = HFTokenizer.from_directory(directory)
    for text in TEXTS:
        assert tok.encode(text) == ref.encode(text)
    assert tok.chat_template is None
    with pytest.raises(FormatError, match=r"tokenizer_config.json: not valid JSON"):
        HFTokenizer.from_bytes((directory / "tokenizer.json").read_bytes(), b"{")


def test_a_token_id_far_beyond_the_vocabulary_is_refused_before_its_tables(dirs: dict[str, Path]) -> None:
    # the fuzzer's out-of-memory input (fuzz/regressions/fuzz_hf_tokenizer/token_id_of_a_billion_oom.bin):
    # one id of about 10**9 sized the id tables by it
    raw = json.loads((dirs["llama2"] / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = raw["model"]["vocab"]
    vocab[next(t for t in vocab if t not in ("<unk>", "<s>", "</s>"))] = 10**9
    with pytest.raises(FormatError, match=r"token id 1000000000 is far beyond the vocabulary's \d+ tokens"):
        HFTokenizer.from_bytes(json.dumps(raw).encode())


# -- load_tokenizer ---------------------------------------------------------------------------


def test_load_tokenizer_picks_the_format(dirs: dict[str, Path], tmp_path: Path) -> None:
    assert isinstance(load_tokenizer(dirs["llama3"]), HFTokenizer)
    assert isinstance(load_tokenizer(dirs["gpt2"]), HFTokenizer)  # tokenizer.json wins
    gpt2_only = tmp_path / "gpt2"
    gpt2_only.mkdir()
    for name in ("vocab.json", "merges.txt"):
        (gpt2_only / name).write_bytes((GPT2_DATA / name).read_bytes())
    tok = load_tokenizer(gpt2_only)
    assert isinstance(tok, BpeTokenizer) and tok.chat_template is None
    assert tok.encode("Hello world") == [15496, 995]
    write_config(
        gpt2_only,
        chat_template="{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}",
        eos_token="<|endoftext|>",
    )
    tok = load_tokenizer(gpt2_only)
    assert isinstance(tok, BpeTokenizer) and tok.chat_template is not None
    assert tok.chat_template.render([{"role": "user", "content": "hi"}]) == "hi<|endoftext|>"
    assert BpeTokenizer.from_directory(gpt2_only).chat_template is None


def test_load_tokenizer_attaches_the_chat_template_file(dirs: dict[str, Path], tmp_path: Path) -> None:
    directory = write_byte_level(tmp_path / "b", chat_template="from config {{ bos_token }}")
    tok = load_tokenizer(directory)
    assert tok.chat_template is not None and tok.chat_template.render([]) == "from config <|im_start|>"
    (directory / "chat_template.jinja").write_text("from file {{ eos_token }}", encoding="utf-8")
    tok = load_tokenizer(directory)
    assert tok.chat_template is not None and tok.chat_template.render([]) == "from file <|im_end|>"
    assert HFTokenizer.from_directory(dirs["llama2"]).chat_template is None


def test_load_tokenizer_without_a_tokenizer_names_the_files(tmp_path: Path) -> None:
    with pytest.raises(
        FormatError, match=r"holds no tokenizer: looked for tokenizer.json, or vocab.json and merges.txt"
    ):
        load_tokenizer(tmp_path)
    (tmp_path / "vocab.json").write_text("{}")
    with pytest.raises(FormatError, match=r"holds no tokenizer"):
        load_tokenizer(tmp_path)
    with pytest.raises(FormatError, match=r"is not a directory"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(FormatError, match=r"no tokenizer.json in this directory"):
        HFTokenizer.from_directory(tmp_path)
