"""Tests for kael.tokenizer: GPT-2 byte-level BPE against tiktoken's ids, file validation,
long runs, the piece cache and the incremental decoder."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kael._errors import DTypeError, FormatError, IndexError_, KaelError
from kael.tokenizer import BpeTokenizer, IncrementalDecoder, SupportsDecode, _pretokenize
from kael.tokenizer._bpe import MergeTable, merge_long, merge_short
from kael.tokenizer._bytes import BYTE_TO_CHAR, CHAR_TO_BYTE, token_to_bytes
from kael.tokenizer._cache import PieceCache

DATA = Path(__file__).resolve().parent.parent / "data" / "gpt2-tokenizer"
CASES = [json.loads(line) for line in (DATA / "cases.jsonl").read_text(encoding="utf-8").splitlines()]
EOT = "<|endoftext|>"

# GPT-2's pattern verbatim (kael reorders the alternatives): the oracle for the pre-tokenizer.
GPT2_REFERENCE = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

TEXT = st.text(alphabet=st.characters(codec="utf-8"))
# A few characters of every kind the pattern tells apart (letters, numbers, Unicode
# whitespace and what is not, contraction letters, astral code points), densely mixed.
MIXED_ALPHABET = list(
    " \t\n\r\x0b\x0c\x1c\x85\xa0\u1680\u2000\u2028\u3000aZsdmtlvreé\u0301ß1²\u0663'!.,-_<|>"
    "\U0001f642\U00010400\U0001d7ce\U0002a6d6\ufffd"
)
MIXED = st.lists(st.sampled_from(MIXED_ALPHABET), max_size=60).map("".join)


@pytest.fixture(scope="module")
def tok() -> BpeTokenizer:
    return BpeTokenizer.from_directory(DATA)


@pytest.fixture(scope="module")
def vocab() -> dict[str, int]:
    result: dict[str, int] = json.loads((DATA / "vocab.json").read_text(encoding="utf-8"))
    return result


def byte_token_ids(vocab: dict[str, int], data: bytes) -> list[int]:
    """The one-byte token ids for ``data``, through the vocabulary's byte table."""
    return [vocab[BYTE_TO_CHAR[b]] for b in data]


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
