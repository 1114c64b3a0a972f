"""Fuzz target: the BPE tokenizer's file loading and its encode/decode round trip.

An input is `vocab.json NUL merges.txt NUL text` (missing parts are empty). Each input:

* builds a tokenizer from the fuzzed vocab and merges bytes (`BpeTokenizer.from_bytes`):
  success or `kael.FormatError` only; a tokenizer that loads must round-trip the text;
* round-trips the text through the real GPT-2 tokenizer (tests/data/gpt2-tokenizer/):
  `decode(encode(text))` gives back the text's UTF-8 bytes, with and without special
  tokens allowed, every id is in range, and the incremental decoder streams the same text.

The text is the fuzzed bytes decoded with "surrogateescape", so invalid UTF-8 arrives as
lone surrogates, which `encode` spells as U+FFFD.
"""

from __future__ import annotations

from typing import Literal

import _harness

with _harness.instrumented(__name__ == "__main__", ["kael"]):
    from kael import FormatError
    from kael.tokenizer import BpeTokenizer

GPT2_DIR = _harness.ROOT / "tests" / "data" / "gpt2-tokenizer"
GPT2 = BpeTokenizer.from_directory(GPT2_DIR)


def _expected_bytes(text: str) -> bytes:
    """The UTF-8 bytes of `text` with each lone surrogate replaced by U+FFFD."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


def _round_trip(tok: BpeTokenizer, text: str, expected: bytes) -> None:
    ids: list[int] = []
    allowed: frozenset[str] | Literal["all"]
    for allowed in (frozenset(), "all"):
        ids = tok.encode(text, allowed_special=allowed)
        bad = [i for i in ids if not (type(i) is int and 0 <= i < tok.vocab_size)]
        if bad:
            raise AssertionError(f"encode gave ids outside 0..{tok.vocab_size - 1}: {bad[:5]}")
        got = tok.decode(ids)
        if got != expected:
            raise AssertionError(f"round trip (allowed_special={allowed!r}) gave {got!r}, expected {expected!r}")
    stream = tok.incremental_decoder()
    streamed = "".join(stream.add(i) for i in ids) + stream.flush()
    if streamed != tok.decode_text(ids):
        raise AssertionError(f"incremental decoder gave {streamed!r}, decode_text {tok.decode_text(ids)!r}")


def TestOneInput(data: bytes) -> None:
    vocab, _, rest = data.partition(b"\0")
    merges, _, raw_text = rest.partition(b"\0")
    text = raw_text.decode("utf-8", "surrogateescape")
    expected = _expected_bytes(text)
    try:
        fuzzed: BpeTokenizer | None = BpeTokenizer.from_bytes(vocab, merges)
    except FormatError:
        fuzzed = None
    if fuzzed is not None:
        _round_trip(fuzzed, text, expected)
    _round_trip(GPT2, text, expected)


if __name__ == "__main__":
    _harness.fuzz(TestOneInput)
