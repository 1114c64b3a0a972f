"""kael.engine's Detokenizer: a sequence's text as its tokens arrive.

Oracle: the tokenizer's decode of the whole id list (bytes as UTF-8 with U+FFFD for what never
forms a character) cut at the first stop string by plain ``str.find``; text pieces come out only
as whole characters, and the concatenation of the pieces and the flush is that text.
"""

from __future__ import annotations

from pathlib import Path

import kael
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kael.engine import Detokenizer, SamplingParams, SequenceStop

TOKENIZER = Path(__file__).resolve().parents[1] / "data" / "gpt2-tokenizer"
EOT = 50256


_TOK = kael.BpeTokenizer.from_directory(TOKENIZER)
BYTE_IDS = {d[0]: t for t in range(EOT) if len(d := _TOK.decode([t])) == 1}
"""The id of the token that is exactly one byte, for each byte (GPT-2's byte-level tokens)."""


@pytest.fixture(scope="module")
def tok() -> kael.BpeTokenizer:
    return _TOK


def _run(tok: kael.BpeTokenizer, ids: list[int], params: SamplingParams) -> tuple[list[str], str, int]:
    stop = SequenceStop(params, eos_ids=[EOT])
    text = Detokenizer(tok, stop)
    pieces = []
    for t in ids:
        if not stop.token(t):
            break
        pieces.append(text.token(t))
        if stop.stopped:
            break
    pieces.append(text.flush())
    return pieces, "".join(pieces), text.chars


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=40), st.sampled_from(["", "\n", "é", "the", "ab"]), st.booleans())
def test_the_pieces_are_the_decoded_text_cut_at_the_first_stop(text: str, stop: str, bytewise: bool) -> None:
    tok = _TOK
    # one token per byte splits every multi-byte character across tokens
    ids = [BYTE_IDS[b] for b in text.encode("utf-8")] if bytewise else tok.encode(text)
    params = SamplingParams(max_tokens=1000, stop=(stop,) if stop else ())
    pieces, got, _ = _run(tok, ids, params)
    whole = tok.decode(ids).decode("utf-8", errors="replace")
    cut = whole.find(stop) if stop else -1
    assert got == (whole[:cut] if cut >= 0 else whole)
    for piece in pieces:  # whole characters only: no piece ends inside a character
        assert "\ufffd" not in piece or "\ufffd" in whole


def test_a_character_split_across_tokens_waits_for_its_last_byte(tok: kael.BpeTokenizer) -> None:
    ids = [BYTE_IDS[b] for b in "a€b".encode()]  # a, E2 82 AC, b
    pieces, got, chars = _run(tok, ids, SamplingParams(max_tokens=100))
    assert pieces == ["a", "", "", "€", "b", ""] and got == "a€b" and chars == 3
    # a character never completed comes out at the end as U+FFFD
    assert _run(tok, ids[:3], SamplingParams(max_tokens=100))[1] == "a\ufffd"


def test_min_tokens_and_end_ids(tok: kael.BpeTokenizer) -> None:
    ids = tok.encode("one. two. three.")
    # the stop string counts from min_tokens on: the first "." is inside the first tokens
    pieces, got, _ = _run(tok, ids, SamplingParams(max_tokens=100, stop=(".",), min_tokens=3))
    assert got == "one. two"
    # an end id ends the text and is not part of it; with ignore_eos it shows no text
    assert _run(tok, [*tok.encode("hi"), EOT, *tok.encode("x")], SamplingParams(max_tokens=9))[1] == "hi"
    ignored = SamplingParams(max_tokens=9, ignore_eos=True)
    assert _run(tok, [*tok.encode("hi"), EOT, *tok.encode("x")], ignored)[1] == "hix"
