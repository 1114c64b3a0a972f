"""Tests for kael.tokenizer's decoding: BpeTokenizer's ``decode`` and ``decode_text`` (bad ids, iterables,
invalid UTF-8, the byte table) and the incremental decoder, which holds back partial characters and, over
GPT-2's tokenizer or any tokenizer with ``decode(ids) -> bytes``, streams exactly what one-shot decoding gives.
"""

from __future__ import annotations

import pytest
from bpe_tokenizer_common import MIXED, TEXT, byte_token_ids
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kael._errors import DTypeError, IndexError_, KaelError
from kael.tokenizer import BpeTokenizer, IncrementalDecoder, SupportsDecode
from kael.tokenizer._bytes import BYTE_TO_CHAR, CHAR_TO_BYTE, token_to_bytes

# -- decoding --------------------------------------------------------------------------


def test_decode_rejects_bad_ids(tok: BpeTokenizer) -> None:
    for bad in (50257, -1, 10**30):
        with pytest.raises(IndexError_, match=rf"{bad}.*50257") as info:
            tok.decode([15496, bad])
        assert isinstance(info.value, KaelError) and isinstance(info.value, IndexError)
    with pytest.raises(DTypeError, match="'x'"):
        tok.decode([1, "x"])  # type: ignore[list-item]
    with pytest.raises(DTypeError, match="1.5"):
        tok.decode([1.5])  # type: ignore[list-item]


def test_decode_accepts_iterables(tok: BpeTokenizer) -> None:
    ids = tok.encode("Hello world")
    assert tok.decode(iter(ids)) == tok.decode(tuple(ids)) == b"Hello world"
    assert tok.decode([]) == b"" and tok.decode_text([]) == ""
    assert tok.token_bytes(220) == b" "


def test_decode_text_errors(tok: BpeTokenizer, vocab: dict[str, int]) -> None:
    ids = byte_token_ids(vocab, b"ok\xff")
    assert tok.decode(ids) == b"ok\xff"
    assert tok.decode_text(ids) == "ok\ufffd"
    with pytest.raises(UnicodeDecodeError):
        tok.decode_text(ids, errors="strict")


def test_byte_table() -> None:
    assert len(set(BYTE_TO_CHAR)) == 256
    assert BYTE_TO_CHAR[ord(" ")] == "Ġ" and BYTE_TO_CHAR[ord("\n")] == "Ċ" and BYTE_TO_CHAR[ord("A")] == "A"
    assert all(CHAR_TO_BYTE[c] == b for b, c in enumerate(BYTE_TO_CHAR))
    assert token_to_bytes("".join(BYTE_TO_CHAR)) == bytes(range(256))


# -- incremental decoding ------------------------------------------------------------------


def test_incremental_decoder_holds_back_partial_characters(tok: BpeTokenizer, vocab: dict[str, int]) -> None:
    decoder = tok.incremental_decoder()
    assert isinstance(decoder, IncrementalDecoder)
    outputs = [decoder.add(i) for i in byte_token_ids(vocab, b"\xc3\xb1\xe2\x82\xac")]
    assert outputs == ["", "ñ", "", "", "€"]
    assert decoder.flush() == ""
    # An incomplete sequence at the end is flushed as a replacement character.
    assert decoder.add_many(byte_token_ids(vocab, b"a\xe2\x82")) == "a"
    assert decoder.flush() == "\ufffd"
    assert decoder.add(vocab["Hello"]) == "Hello"
    decoder.add_many(byte_token_ids(vocab, b"\xe2"))
    decoder.reset()
    assert decoder.add(vocab["!"]) == "!"


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(TEXT, MIXED))
def test_incremental_equals_full_decode_for_text(tok: BpeTokenizer, text: str) -> None:
    ids = tok.encode(text)
    decoder = IncrementalDecoder(tok)
    assert "".join(decoder.add(i) for i in ids) + decoder.flush() == text


@settings(deadline=None)
@given(st.binary(max_size=40))
def test_incremental_equals_full_decode_for_any_bytes(tok: BpeTokenizer, vocab: dict[str, int], data: bytes) -> None:
    ids = byte_token_ids(vocab, data)
    decoder = tok.incremental_decoder()
    assert "".join(decoder.add(i) for i in ids) + decoder.flush() == tok.decode_text(ids)


class _Bytes:
    """Any tokenizer with ``decode(ids) -> bytes`` (SupportsDecode): here token i is byte i."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def decode(self, ids: list[int]) -> bytes:
        self.calls.append(ids)
        return bytes(ids)


@given(st.binary(max_size=60), st.lists(st.integers(min_value=0, max_value=60), max_size=6))
def test_incremental_decoder_over_any_byte_tokenizer(data: bytes, cuts: list[int]) -> None:
    source: SupportsDecode = _Bytes()
    decoder = IncrementalDecoder(source)
    bounds = [0, *sorted(c for c in cuts if c <= len(data)), len(data)]
    pieces = [decoder.add_many(data[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    text = "".join(pieces) + decoder.flush()
    assert text == data.decode("utf-8", errors="replace")  # the oracle: one-shot decoding
    assert all(isinstance(ids, list) for ids in source.calls)  # what SupportsDecode promises


def test_incremental_decoder_errors_argument() -> None:
    strict = IncrementalDecoder(_Bytes(), errors="strict")
    assert strict.add(0xC3) == ""
    with pytest.raises(UnicodeDecodeError):
        strict.add(0x41)  # C3 41 is no character
    ignore = IncrementalDecoder(_Bytes(), errors="ignore")
    assert ignore.add_many(b"a\xffb") == "ab"
