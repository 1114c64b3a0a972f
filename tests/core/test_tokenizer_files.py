"""Tests for kael.tokenizer's BpeTokenizer file validation: malformed vocab.json and merges.txt files are
FormatErrors naming the file and the rule, small valid files (with or without the version header, CRLF, no
merges) load, in-memory vocabularies and merges are validated alike, special tokens (declared, or
<|endoftext|> missing), and randomly mutated files load or raise a FormatError, never another exception.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bpe_tokenizer_common import EOT
from hypothesis import given, settings
from hypothesis import strategies as st
from kael._errors import FormatError, KaelError
from kael.tokenizer import BpeTokenizer
from kael.tokenizer._bytes import BYTE_TO_CHAR

# -- malformed files -------------------------------------------------------------------

# A small valid byte-level vocabulary: the 256 bytes, two merges, <|endoftext|>.
SMALL_TOKENS = [*BYTE_TO_CHAR, "Ġt", "he", "<|endoftext|>"]
SMALL_VOCAB = {t: i for i, t in enumerate(SMALL_TOKENS)}
SMALL_MERGES = "#version: 0.2\nĠ t\nh e\n"


def vocab_json(entries: dict[str, Any] | list[tuple[str, Any]]) -> bytes:
    items = entries.items() if isinstance(entries, dict) else entries
    return ("{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in items) + "}").encode()


def with_entry(key: str, value: Any) -> dict[str, Any]:
    return {**SMALL_VOCAB, key: value}


def without(key: str) -> dict[str, Any]:
    entries: dict[str, Any] = {k: v for k, v in SMALL_VOCAB.items() if k != key}
    return {k: i for i, k in enumerate(entries)}


BAD_VOCABS: dict[str, tuple[bytes, str]] = {
    "not utf-8": (b'{"\xff": 0}', "UTF-8"),
    "utf-16": ('{"a": 0}'.encode("utf-16"), "UTF-8"),
    "not json": (b'{"!": 0,', "JSON"),
    "nested too deeply": (b"[" * 100_000, "JSON"),
    "array": (b"[1, 2]", "JSON object"),
    "empty object": (b"{}", "empty"),
    "id is a string": (vocab_json(with_entry("x", "257")), "integer"),
    "id is a float": (vocab_json(with_entry("x", 259.0)), "integer"),
    "id is a bool": (vocab_json(with_entry("x", True)), "integer"),
    "duplicate token": (vocab_json([*SMALL_VOCAB.items(), ("he", 259)]), "more than once"),
    "duplicate id": (vocab_json(with_entry("x", 3)), "unique"),
    "ids not dense": (vocab_json(with_entry("x", 1000)), "dense"),
    "negative id": (vocab_json({**{k: v + 1 for k, v in SMALL_VOCAB.items()}, "x": -1}), "dense"),
    "not byte-level": (vocab_json(with_entry("a b", len(SMALL_VOCAB))), "byte-level"),
    "empty token": (vocab_json(with_entry("", len(SMALL_VOCAB))), "non-empty"),
    "missing byte": (vocab_json(without(BYTE_TO_CHAR[0x41])), "byte 0x41"),
}

BAD_MERGES: dict[str, tuple[bytes, str]] = {
    "not utf-8": (b"#version: 0.2\n\xc3\x28 t\n", "UTF-8"),
    "one token": ("Ġt\n".encode(), "two tokens"),
    "three tokens": ("Ġ t x\n".encode(), "two tokens"),
    "double space": ("Ġ  t\n".encode(), "two tokens"),
    "leading space": (" Ġ t\n".encode(), "two tokens"),
    "tab separated": ("Ġ\tt\n".encode(), "two tokens"),
    "blank line": ("Ġ t\n\nh e\n".encode(), "line 2"),
    "part not in vocab": ("Ġ t\nhe x\n".encode(), "'he' \\+ 'x'"),
    "result not in vocab": (b"t h\n", "'th'"),
    "duplicate merge": ("#version: 0.2\nĠ t\nh e\nĠ t\n".encode(), "line 4.*repeats line 2"),
}


@pytest.mark.parametrize("case", list(BAD_VOCABS), ids=list(BAD_VOCABS))
def test_malformed_vocab(tmp_path: Path, case: str) -> None:
    data, message = BAD_VOCABS[case]
    (tmp_path / "vocab.json").write_bytes(data)
    (tmp_path / "merges.txt").write_bytes(SMALL_MERGES.encode())
    with pytest.raises(FormatError, match=message) as info:
        BpeTokenizer.from_directory(tmp_path)
    assert str(tmp_path / "vocab.json") in str(info.value)


@pytest.mark.parametrize("case", list(BAD_MERGES), ids=list(BAD_MERGES))
def test_malformed_merges(tmp_path: Path, case: str) -> None:
    data, message = BAD_MERGES[case]
    (tmp_path / "vocab.json").write_bytes(vocab_json(SMALL_VOCAB))
    (tmp_path / "merges.txt").write_bytes(data)
    with pytest.raises(FormatError, match=message) as info:
        BpeTokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert str(tmp_path / "merges.txt") in str(info.value)


@pytest.mark.parametrize(
    "merges",
    [SMALL_MERGES, "Ġ t\nh e\n", "Ġ t\nh e", "#version: 0.2\r\nĠ t\r\nh e\r\n", "#version: 0.2\n", ""],
    ids=["header", "no header", "no final newline", "crlf", "header only", "empty"],
)
def test_small_valid_files(merges: str) -> None:
    tok = BpeTokenizer.from_bytes(vocab_json(SMALL_VOCAB), merges.encode())
    assert tok.vocab_size == 259 and tok.eot_token == 258
    text = "the tea, 🙂"
    ids = tok.encode(text)
    assert tok.decode(ids) == text.encode()
    if "h e" in merges:
        assert ids[:2] == [SMALL_VOCAB["t"], SMALL_VOCAB["he"]]


def test_in_memory_data_is_validated() -> None:
    with pytest.raises(FormatError, match=r"merges\[1\].*pair"):
        BpeTokenizer(SMALL_VOCAB, [("Ġ", "t"), ("h",)])  # type: ignore[list-item]
    with pytest.raises(FormatError, match=r"merges\[0\].*not in the vocabulary"):
        BpeTokenizer(SMALL_VOCAB, [("x", "y")])
    with pytest.raises(FormatError, match="dense"):
        BpeTokenizer({**SMALL_VOCAB, "x": 500}, [])
    with pytest.raises(FormatError, match="integer"):
        BpeTokenizer({**SMALL_VOCAB, "x": "259"}, [])  # type: ignore[dict-item]


def test_vocabulary_without_endoftext() -> None:
    tok = BpeTokenizer(without("<|endoftext|>"), [])  # Ġt and he: unreachable, still not special
    assert tok.special_tokens == {}
    with pytest.raises(KaelError, match="endoftext"):
        tok.eot_token  # noqa: B018
    assert tok.encode("<|endoftext|>", allowed_special="all") == tok.encode("<|endoftext|>")


def test_declared_special_tokens() -> None:
    vocab = {**SMALL_VOCAB, "<pad>": len(SMALL_VOCAB)}
    tok = BpeTokenizer.from_bytes(vocab_json(vocab), SMALL_MERGES.encode(), special_tokens=["<pad>", EOT])
    assert tok.special_tokens == {"<pad>": 259, EOT: 258}
    assert tok.encode("a<pad>", allowed_special={"<pad>"}) == [SMALL_VOCAB["a"], 259]
    assert tok.decode([259, 258]) == b"<pad><|endoftext|>"
    with pytest.raises(FormatError, match="'<mask>' is not in the vocabulary"):
        BpeTokenizer(vocab, [], special_tokens=["<mask>"])


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with a few random byte edits (replace, insert, delete) or truncated."""
    result = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        position = draw(st.integers(0, len(result)))
        kind = draw(st.sampled_from(["replace", "insert", "delete", "truncate"]))
        if kind == "truncate":
            del result[position:]
        elif kind == "insert":
            result[position:position] = draw(st.binary(min_size=1, max_size=3))
        elif position < len(result):
            if kind == "delete":
                del result[position]
            else:
                result[position] = draw(st.integers(0, 255))
    return bytes(result)


@settings(deadline=None, max_examples=300)
@given(st.one_of(mutated(vocab_json(SMALL_VOCAB)), st.binary(max_size=64)), mutated(SMALL_MERGES.encode()))
def test_mutated_files_load_or_raise_format_error(vocab_bytes: bytes, merges_bytes: bytes) -> None:
    try:
        tok = BpeTokenizer.from_bytes(vocab_bytes, merges_bytes)
    except FormatError:
        return
    assert tok.decode(tok.encode("the tea")) == b"the tea"
