"""Tests for kael.tokenizer's BpeTokenizer encoding: GPT-2 byte-level BPE against tiktoken's ids (tests/data),
the loaders, special tokens, round trips of any text, long runs, the pre-tokenizer against GPT-2's own pattern,
the heap merge loop against the simple one, and the piece cache (bounded, shared by threads). Decoding is
tested in test_tokenizer_decode.py, malformed and small vocabulary files in test_tokenizer_files.py.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import regex
from bpe_tokenizer_common import DATA, EOT, MIXED, TEXT, byte_token_ids
from hypothesis import given, settings
from hypothesis import strategies as st
from kael._errors import DTypeError, KaelError
from kael.tokenizer import BpeTokenizer, _pretokenize
from kael.tokenizer._bpe import MergeTable, merge_long, merge_short
from kael.tokenizer._cache import PieceCache

CASES = [json.loads(line) for line in (DATA / "cases.jsonl").read_text(encoding="utf-8").splitlines()]

# GPT-2's pattern verbatim (kael reorders the alternatives): the oracle for the pre-tokenizer.
GPT2_REFERENCE = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


# -- reference cases -------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_matches_tiktoken_ids(tok: BpeTokenizer, case: dict[str, Any]) -> None:
    allowed = frozenset(case.get("allowed_special", ()))
    ids = tok.encode(case["text"], allowed_special=allowed)
    assert ids == case["ids"]
    assert tok.decode(ids) == case["text"].encode("utf-8")


def test_loaders_agree(tok: BpeTokenizer, vocab: dict[str, int]) -> None:
    merges_lines = (DATA / "merges.txt").read_text(encoding="utf-8").splitlines()[1:]
    merges = [(a, b) for a, b in (line.split(" ") for line in merges_lines)]
    loaded = [
        BpeTokenizer.from_files(DATA / "vocab.json", str(DATA / "merges.txt")),
        BpeTokenizer.from_bytes((DATA / "vocab.json").read_bytes(), (DATA / "merges.txt").read_bytes()),
        BpeTokenizer(vocab, merges),
    ]
    text = "Hello world! It's 2024: naïve café, 東京, 🙂 <|endoftext|>\n\n  x"
    for other in loaded:
        assert other.encode(text) == tok.encode(text)
        assert other.vocab_size == tok.vocab_size


def test_properties(tok: BpeTokenizer) -> None:
    assert tok.vocab_size == 50257
    assert tok.eot_token == 50256
    assert tok.special_tokens == {EOT: 50256}
    assert "50257" in repr(tok)


# -- special tokens --------------------------------------------------------------------


def test_endoftext_is_plain_text_unless_allowed(tok: BpeTokenizer) -> None:
    text = f"Hi{EOT}there"
    plain = tok.encode(text)
    assert 50256 not in plain
    assert tok.decode(plain) == text.encode()
    assert plain == tok.encode("Hi") + tok.encode(EOT) + tok.encode("there")
    expected = tok.encode("Hi") + [50256] + tok.encode("there")
    assert tok.encode(text, allowed_special={EOT}) == expected
    assert tok.encode(text, allowed_special="all") == expected
    assert tok.encode(EOT + EOT, allowed_special="all") == [50256, 50256]
    assert tok.decode([50256]) == EOT.encode()


def test_allowed_special_is_checked(tok: BpeTokenizer) -> None:
    with pytest.raises(KaelError, match="<|unknown|>"):
        tok.encode("x", allowed_special={"<|unknown|>"})
    with pytest.raises(KaelError, match="'all'"):
        tok.encode("x", allowed_special=EOT)  # a str other than "all": a likely slip for {EOT}


def test_encode_rejects_non_text(tok: BpeTokenizer) -> None:
    with pytest.raises(DTypeError, match="bytes"):
        tok.encode(b"abc")  # type: ignore[arg-type]


def test_lone_surrogates_encode_as_replacement_character(tok: BpeTokenizer) -> None:
    assert tok.encode("a\ud800b") == tok.encode("a\ufffdb")


# -- round trips -----------------------------------------------------------------------


@settings(deadline=None)
@given(TEXT)
def test_round_trip_any_text(tok: BpeTokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text.encode("utf-8")
    assert tok.decode_text(ids) == text


@settings(deadline=None)
@given(st.lists(st.one_of(TEXT, MIXED, st.just(EOT)), max_size=6).map("".join))
def test_round_trip_with_special(tok: BpeTokenizer, text: str) -> None:
    ids = tok.encode(text, allowed_special="all")
    assert tok.decode(ids) == text.encode("utf-8")
    assert ids.count(50256) == text.count(EOT)


@pytest.mark.parametrize(
    "text", ["a" * 100_000, "\U0001f642" * 30_000, "1" * 100_000, "ab" * 50_000, " " * 100_000, "é\u0301" * 40_000]
)
def test_long_runs(tok: BpeTokenizer, vocab: dict[str, int], text: str) -> None:
    ids = tok.encode(text)  # the heap merge; the simple loop is the oracle (fast on uniform runs)
    assert tok.decode(ids) == text.encode("utf-8")
    pieces = GPT2_REFERENCE.findall(text)
    table = tok._merges
    expected = [i for piece in pieces for i in merge_short(byte_token_ids(vocab, piece.encode()), table)]
    assert ids == expected


def test_long_run_matches_reference_case(tok: BpeTokenizer) -> None:
    (case,) = [c for c in CASES if set(c["text"]) == {"a"} and len(c["text"]) > 100]
    n = len(case["text"])
    assert tok.encode("a" * (n * 10)) == case["ids"] * 10


# -- pre-tokenizer ---------------------------------------------------------------------


@settings(deadline=None, max_examples=300)
@given(st.lists(st.one_of(MIXED, TEXT), max_size=4).map("".join), st.integers(1, 9))
def test_pretokenize_matches_gpt2_pattern(text: str, block: int) -> None:
    assert _pretokenize.pretokenize(text) == GPT2_REFERENCE.findall(text)
    original = _pretokenize.BLOCK
    _pretokenize.BLOCK = block  # tiny blocks: every block boundary gets exercised
    try:
        assert _pretokenize.pretokenize(text) == GPT2_REFERENCE.findall(text)
    finally:
        _pretokenize.BLOCK = original


def test_pretokenize_engines_agree_on_every_bmp_code_point() -> None:
    # Each code point alone and between letters, digits and spaces: the re engine's
    # spelled-out classes must classify it exactly as the regex engine does.
    findall, _ = _pretokenize._bmp_engine()
    bmp = [chr(c) for c in range(0x10000)]
    for context in ("{}", "a{}a", " {} 1", "{}  x"):
        text = "".join(context.format(c) for c in bmp)
        assert findall(text) == GPT2_REFERENCE.findall(text)


def test_pretokenize_long_mixed_text() -> None:
    text = "\n".join(case["text"] for case in CASES) * 3
    assert _pretokenize.pretokenize(text) == GPT2_REFERENCE.findall(text)


# -- the merge loops -------------------------------------------------------------------


@st.composite
def merge_tables(draw: st.DrawFn) -> tuple[MergeTable, list[int]]:
    """A random merge table over tokens made of 'a', 'b', 'c' (ranks in random order, so
    not necessarily one a real BPE training would make), and a random symbol sequence."""
    tokens = ["a", "b", "c"]
    pairs: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    for _ in range(draw(st.integers(0, 25))):
        pair = (draw(st.integers(0, len(tokens) - 1)), draw(st.integers(0, len(tokens) - 1)))
        if pair in seen:
            continue
        seen.add(pair)
        pairs.append(pair)
        merged = tokens[pair[0]] + tokens[pair[1]]
        if merged not in tokens:
            tokens.append(merged)
    order = draw(st.permutations(range(len(pairs))))
    ranked = [pairs[i] for i in order]
    results = [tokens.index(tokens[a] + tokens[b]) for a, b in ranked]
    ids = draw(st.lists(st.integers(0, 2), max_size=80))
    return MergeTable(ranked, results), ids


@settings(max_examples=500)
@given(merge_tables())
def test_heap_merge_equals_reference_loop(table_and_ids: tuple[MergeTable, list[int]]) -> None:
    table, ids = table_and_ids
    assert merge_long(list(ids), table) == merge_short(list(ids), table)


def test_heap_merge_batches_equal_ranks() -> None:
    # a=0 b=1 ab=2 aba=3; ("ab", "a") outranks ("a", "b"), which makes "ab". Reference
    # semantics merge every (a, b) first (-> ab ab) and then find no (ab, a) left.
    table = MergeTable([(2, 0), (0, 1)], [3, 2])
    assert merge_short([0, 1, 0, 1], table) == [2, 2]
    assert merge_long([0, 1, 0, 1], table) == [2, 2]


@settings(deadline=None)
@given(st.binary(max_size=200))
def test_heap_merge_equals_reference_loop_gpt2(tok: BpeTokenizer, vocab: dict[str, int], data: bytes) -> None:
    ids = byte_token_ids(vocab, data)
    assert merge_long(list(ids), tok._merges) == merge_short(list(ids), tok._merges)


# -- the cache -------------------------------------------------------------------------


def test_piece_cache_is_bounded() -> None:
    calls: list[str] = []

    def compute(piece: str) -> tuple[int, ...]:
        calls.append(piece)
        return (len(piece),)

    cache = PieceCache(compute, max_entries=8, max_piece_chars=5)
    for i in range(100):
        assert cache[f"p{i}"] == (len(f"p{i}"),)
        assert len(cache) <= 8
    assert cache["p99"] == (3,) and calls.count("p99") == 1  # recent entries survive
    assert cache["x" * 6] == (6,) and "x" * 6 not in cache  # too long to keep


def test_tokenizer_cache_stays_bounded(tok: BpeTokenizer) -> None:
    text = " ".join(str(i) for i in range(70_000, 150_000))  # 80,000 distinct pieces
    ids = tok.encode(text)
    assert len(tok._cache) <= 65_536
    assert tok.decode(ids) == text.encode()


def test_concurrent_encode(tok: BpeTokenizer) -> None:
    texts = [" ".join(f"w{i}x{j}" for j in range(3000)) for i in range(8)]
    expected = [tok.encode(t) for t in texts]
    fresh = BpeTokenizer.from_directory(DATA)
    fresh._cache = PieceCache(fresh._bpe, max_entries=512)  # constant eviction while threads race
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(fresh.encode, texts * 3)) == expected * 3
