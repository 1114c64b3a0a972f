"""Tests for kael.tokenizer's HFTokenizer and load_tokenizer against transformers' AutoTokenizer.

Tokenizer directories are built offline (``hf_fixtures``): byte-level BPE (SmolLM2/Qwen2
style), Llama 2 byte-fallback BPE over Metaspace, Llama 3 (regex split + byte level,
BOS from the post-processor), and GPT-2's real vocabulary as ``tokenizer.json``. The
oracles are ``transformers.AutoTokenizer.from_pretrained(directory)`` (the fast
tokenizer) for ids and text, and tiktoken's GPT-2 ids in tests/data.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")

import kael  # noqa: E402
from hf_fixtures import GPT2_DATA, write_byte_level, write_config, write_gpt2, write_llama2, write_llama3  # noqa: E402
from kael import ChatTemplateError, DTypeError, FormatError, IndexError_, KaelError  # noqa: E402
from kael.tokenizer import BpeTokenizer, ChatTemplate, HFTokenizer, IncrementalDecoder, load_tokenizer  # noqa: E402

KINDS: dict[str, Callable[..., Path]] = {"byte_level": write_byte_level, "llama2": write_llama2, "llama3": write_llama3}

TEXTS = [
    "",
    "Hello world",
    " ",
    "   leading and trailing   ",
    "\n\n\t tabs\tand\r\nnewlines\n",
    "émoji 🙂🚀 中文 ñ €",
    "👩\u200d👩\u200d👧\u200d👦 family",
    "zzzq qqq ¿¡ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<s>[INST] hello [/INST] ok </s>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<|endoftext|>a<|endoftext|>",
    "<|im_end",
    "I'm sure they'll see we've done it.",
    "def f(x):\n    return x ** 2\n",
    "\x00\x01 control \x7f",
]

SPECIAL_PIECES = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<s>",
    "</s>",
    "<unk>",
    "<|begin_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
]
PIECES = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=12),
    st.sampled_from(SPECIAL_PIECES),
    st.sampled_from([" ", "  ", "\n", "\n\n", "\t", " \n ", "▁", "🙂", "中文", "é", "\u0301", "\ufffd", "<0x41>"]),
)
MIXED_TEXT = st.lists(PIECES, max_size=10).map("".join)


def _auto(directory: Path) -> Any:
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoTokenizer.from_pretrained(directory)


def _quiet_decode(hf: Any, ids: list[int], **kwargs: Any) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return str(hf.decode(ids, **kwargs))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-tokenizers")
    made = {name: write(root / name) for name, write in KINDS.items()}
    made["gpt2"] = write_gpt2(root / "gpt2")
    return made


@pytest.fixture(scope="module")
def pairs(dirs: dict[str, Path]) -> dict[str, tuple[HFTokenizer, Any]]:
    return {name: (HFTokenizer.from_directory(path), _auto(path)) for name, path in dirs.items()}


def _stream(tok: HFTokenizer, ids: list[int]) -> list[str]:
    decoder = tok.incremental_decoder()
    return [decoder.add(i) for i in ids] + [decoder.flush()]


# -- ids and text equal transformers' ----------------------------------------------------


@pytest.mark.parametrize("kind", [*KINDS, "gpt2"])
@pytest.mark.parametrize("text", TEXTS, ids=[f"text{i}" for i in range(len(TEXTS))])
def test_encode_and_decode_match_transformers(pairs: dict[str, tuple[HFTokenizer, Any]], kind: str, text: str) -> None:
    tok, hf = pairs[kind]
    for add in (True, False):
        ids = tok.encode(text, add_special_tokens=add)
        assert ids == hf(text, add_special_tokens=add)["input_ids"]
        assert all(type(i) is int for i in ids)
        for skip in (False, True):
            assert tok.decode_text(ids, skip_special_tokens=skip) == _quiet_decode(hf, ids, skip_special_tokens=skip)


@pytest.mark.parametrize("kind", [*KINDS, "gpt2"])
def test_mixed_text_matches_transformers(pairs: dict[str, tuple[HFTokenizer, Any]], kind: str) -> None:
    tok, hf = pairs[kind]

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(text=MIXED_TEXT, add=st.booleans())
    def check(text: str, add: bool) -> None:
        ids = tok.encode(text, add_special_tokens=add)
        assert ids == hf(text, add_special_tokens=add)["input_ids"]
        text_out = tok.decode_text(ids)
        assert text_out == _quiet_decode(hf, ids)
        # Streaming yields decode(ids) exactly, never a split character.
        parts = _stream(tok, ids)
        streamed = "".join(parts)
        assert streamed == tok.decode(ids).decode("utf-8", "replace")
        if "\ufffd" not in text:
            assert "\ufffd" not in streamed
        assert streamed == text_out or (kind == "llama2" and streamed == " " + text_out)

    check()


def test_byte_level_streams_the_decoded_text_character_by_character(pairs: dict[str, tuple[HFTokenizer, Any]]) -> None:
    tok, hf = pairs["byte_level"]
    text = "中文 🙂 ñ€ русский"
    ids = tok.encode(text)
    assert len(ids) > len(text.split())  # several characters span byte tokens
    parts = _stream(tok, ids)
    assert "".join(parts) == text == _quiet_decode(hf, ids)
    assert all("\ufffd" not in p for p in parts)
    # a lone byte token decodes to bytes that are not UTF-8 on their own
    assert any(_not_utf8(tok.token_bytes(i)) for i in ids)


def test_byte_fallback_streams_whole_characters(pairs: dict[str, tuple[HFTokenizer, Any]]) -> None:
    tok, hf = pairs["llama2"]
    text = "x 💩 ж"  # unseen characters: spelt with <0xHH> tokens
    ids = tok.encode(text)
    assert any(3 <= i < 3 + 256 for i in ids)  # <0xHH> tokens (fixture layout: after <unk> <s> </s>)
    assert any(_not_utf8(tok.token_bytes(i)) for i in ids)
    assert tok.token_bytes(tok.encode("💩", add_special_tokens=False)[-1]) == "💩".encode()[-1:]
    parts = _stream(tok, ids)
    assert "".join(parts) == "<s> x 💩 ж" == _quiet_decode(hf, ids)
    assert all("\ufffd" not in p for p in parts)
    # Without BOS, decode keeps the Metaspace prefix space (the text these ids add after
    # others); decode_text strips it, as transformers does.
    bare = tok.encode(text, add_special_tokens=False)
    assert tok.decode(bare) == b" x \xf0\x9f\x92\xa9 \xd0\xb6"
    assert tok.decode_text(bare) == "x 💩 ж" == _quiet_decode(hf, bare)
    assert tok.decode_text(bare, errors="strict") == "x 💩 ж"


def test_gpt2_tokenizer_json_matches_bpe_tokenizer_and_tiktoken(dirs: dict[str, Path]) -> None:
    tok = HFTokenizer.from_directory(dirs["gpt2"])
    bpe = BpeTokenizer.from_directory(dirs["gpt2"])
    assert tok.vocab_size == bpe.vocab_size == 50257
    assert tok.eot_token == bpe.eot_token == 50256
    assert tok.special_tokens == bpe.special_tokens == {"<|endoftext|>": 50256}
    cases = [json.loads(line) for line in (GPT2_DATA / "cases.jsonl").read_text(encoding="utf-8").splitlines()]
    compared = 0
    for case in cases:
        if "<|endoftext|>" in case["text"] and not case.get("allowed_special"):
            continue  # transformers always parses special tokens in text; these cases keep them as text
        ids = tok.encode(case["text"])
        assert ids == case["ids"] == bpe.encode(case["text"], allowed_special="all"), case["text"][:60]
        assert tok.decode(ids) == bpe.decode(ids)
        assert "".join(_stream(tok, ids)) == bpe.decode_text(ids) == tok.decode_text(ids)
        compared += 1
    assert compared > 300


# -- properties ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [*KINDS, "gpt2"])
def test_properties_match_transformers(pairs: dict[str, tuple[HFTokenizer, Any]], kind: str) -> None:
    tok, hf = pairs[kind]
    assert tok.vocab_size == len(hf)
    assert tok.bos_token == hf.bos_token and tok.eos_token == hf.eos_token
    assert tok.bos_token_id == hf.bos_token_id and tok.eos_token_id == hf.eos_token_id
    assert tok.eot_token == hf.eos_token_id
    expected = {t.content: i for i, t in hf.added_tokens_decoder.items() if t.special}
    assert tok.special_tokens == expected
    for name, token_id in tok.special_tokens.items():
        assert tok.token_bytes(token_id) == name.encode()
        assert tok.encode(name, add_special_tokens=False) == [token_id]


def test_named_tokens_of_the_byte_level_tokenizer(pairs: dict[str, tuple[HFTokenizer, Any]]) -> None:
    tok, _ = pairs["byte_level"]
    assert tok.special_tokens == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    assert (tok.bos_token, tok.bos_token_id, tok.eos_token, tok.eos_token_id) == ("<|im_start|>", 1, "<|im_end|>", 2)
    assert tok.encode("hi") == tok.encode("hi", add_special_tokens=False)  # no BOS for byte-level
    assert "HFTokenizer(vocab_size=" in repr(tok)


def test_kael_exports_the_classes() -> None:
    assert kael.HFTokenizer is HFTokenizer and kael.ChatTemplate is ChatTemplate
    assert kael.load_tokenizer is load_tokenizer
    assert issubclass(ChatTemplateError, KaelError) and "ChatTemplateError" in kael.__all__


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


# -- bad ids and arguments ----------------------------------------------------------------------


def test_bad_ids_name_the_id_and_the_vocab_size(pairs: dict[str, tuple[HFTokenizer, Any]]) -> None:
    tok, _ = pairs["llama2"]
    n = tok.vocab_size
    for bad in ([n], [5, -1], [10**12]):
        for call in (tok.decode, tok.decode_text, lambda ids: tok.incremental_decoder().add_many(ids)):
            with pytest.raises(IndexError_, match=rf"token id {bad[-1]} at position {len(bad) - 1} .* {n} ids"):
                call(bad)
    with pytest.raises(IndexError_, match=rf"token id {n} at position 0"):
        tok.token_bytes(n)
    with pytest.raises(DTypeError, match=r"token ids must be integers, got '3' at position 1"):
        tok.decode([1, "3"])  # type: ignore[list-item]
    with pytest.raises(DTypeError, match=r"got True at position 0"):
        tok.decode([True])
    with pytest.raises(DTypeError, match=r"encode expects text as a str, got bytes"):
        tok.encode(b"hi")  # type: ignore[arg-type]
    with pytest.raises(KaelError, match=r"not UTF-8 at byte 0 .*errors='strict'"):
        tok.decode_text([3 + 0xF0], errors="strict")  # <0xF0> alone
    with pytest.raises(KaelError, match=r"unknown errors handler 'nope'"):
        tok.decode_text([3 + 0x41], errors="nope")
    assert tok.decode_text([3 + 0xF0], errors="ignore") == ""
    assert isinstance(tok.incremental_decoder(), IncrementalDecoder)


def test_integer_like_ids_are_accepted(pairs: dict[str, tuple[HFTokenizer, Any]]) -> None:
    np = pytest.importorskip("numpy")
    tok, _ = pairs["byte_level"]
    ids = tok.encode("Hello world")
    as_numpy = np.array(ids, dtype=np.int64)
    assert tok.decode(as_numpy) == tok.decode(ids) == b"Hello world"
    assert tok.decode_text(list(as_numpy)) == "Hello world"
    assert tok.incremental_decoder().add(as_numpy[0]) == tok.decode_text(ids[:1])


def test_ids_without_a_token_are_index_errors() -> None:
    # A hand-written BPE vocabulary whose ids skip 2
    spec = {
        "version": "1.0",
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 3}, "merges": ["a b"]},
        "added_tokens": [],
    }
    tok = HFTokenizer.from_bytes(json.dumps(spec).encode())
    assert tok.vocab_size == 4
    assert tok.encode("abab") == [3, 3] and tok.decode([3, 0]) == b"aba"
    with pytest.raises(IndexError_, match=r"token id 2 at position 1 stands for no token in this vocabulary of 4 ids"):
        tok.decode([0, 2])
    with pytest.raises(IndexError_, match=r"token id 2 at position 0 stands for no token"):
        tok.decode_text([2])
    with pytest.raises(KaelError, match=r"tokenizer.json: this tokenizer has no end-of-text token"):
        _ = tok.eot_token


def test_lone_surrogates_encode_as_replacement_characters(pairs: dict[str, tuple[HFTokenizer, Any]]) -> None:
    tok, _ = pairs["byte_level"]
    assert tok.encode("a\udc80b") == tok.encode("a\ufffdb")


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


def _not_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


# -- encode_chat ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["llama2", "llama3"])
def test_encode_chat_never_doubles_the_bos(pairs: dict[str, tuple[HFTokenizer, Any]], kind: str) -> None:
    from kael.tokenizer import encode_chat

    tok, auto = pairs[kind]
    assert tok.bos_token is not None
    rendered = f"{tok.bos_token}hello there"  # a template that writes the BOS itself
    ids = encode_chat(tok, rendered)
    assert ids == auto(rendered, add_special_tokens=False)["input_ids"] and ids.count(tok.bos_token_id) == 1
    assert encode_chat(tok, "hello there") == auto("hello there")["input_ids"]  # the config's BOS, once


def test_encode_chat_reads_specials_in_gpt2_text() -> None:
    from kael.tokenizer import encode_chat

    tok = BpeTokenizer.from_directory(GPT2_DATA)
    assert encode_chat(tok, "hi<|endoftext|>") == [5303, 50256]


def test_a_token_id_far_beyond_the_vocabulary_is_refused_before_its_tables(dirs: dict[str, Path]) -> None:
    # the fuzzer's out-of-memory input (fuzz/regressions/fuzz_hf_tokenizer/token_id_of_a_billion_oom.bin):
    # one id of about 10**9 sized the id tables by it
    raw = json.loads((dirs["llama2"] / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = raw["model"]["vocab"]
    vocab[next(t for t in vocab if t not in ("<unk>", "<s>", "</s>"))] = 10**9
    with pytest.raises(FormatError, match=r"token id 1000000000 is far beyond the vocabulary's \d+ tokens"):
        HFTokenizer.from_bytes(json.dumps(raw).encode())
