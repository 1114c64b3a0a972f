"""Tests for kael.tokenizer's HFTokenizer against transformers' AutoTokenizer: ids and text, streaming,
properties, bad ids and arguments, and ``encode_chat``. Tokenizer directories are built offline
(``hf_fixtures``): byte-level BPE (SmolLM2/Qwen2 style), Llama 2 byte-fallback BPE over Metaspace, Llama 3
(regex split + byte level, BOS from the post-processor), and GPT-2's real vocabulary as ``tokenizer.json``. The
oracles are ``transformers.AutoTokenizer.from_pretrained(directory)`` (the fast tokenizer) for ids and text,
and tiktoken's GPT-2 ids in tests/data. tokenizer_config.json, malformed files and ``load_tokenizer`` are
tested in test_hf_tokenizer_files.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")

import kael  # noqa: E402
from hf_fixtures import GPT2_DATA  # noqa: E402
from hf_tokenizer_common import KINDS, TEXTS, write_tokenizer_dirs  # noqa: E402
from hf_tokenizer_common import auto_tokenizer as _auto  # noqa: E402
from hf_tokenizer_common import quiet_decode as _quiet_decode  # noqa: E402
from kael import ChatTemplateError, DTypeError, IndexError_, KaelError  # noqa: E402
from kael.tokenizer import BpeTokenizer, ChatTemplate, HFTokenizer, IncrementalDecoder, load_tokenizer  # noqa: E402

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


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_tokenizer_dirs(tmp_path_factory.mktemp("hf-tokenizers"))


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
