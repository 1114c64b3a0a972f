"""The server's streamed text: kael's IncrementalDecoder (over the server's tokenizer) and
StopMatcher give the same text as decoding or cutting all at once."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st
from kael.engine import StopMatcher
from kael.tokenizer import IncrementalDecoder
from kael_server.jobs import Job, SamplingParams
from kael_server.output import JobOutput

from .fakes import ByteTokenizer


def split(data: bytes | str, cuts: list[int]) -> list:  # type: ignore[type-arg]
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def byte_decoder() -> IncrementalDecoder:
    """The decoder JobOutput uses, over the fake byte-level tokenizer (token i is byte i)."""
    return IncrementalDecoder(ByteTokenizer())


def test_job_output_emits_whole_characters() -> None:
    loop = asyncio.new_event_loop()  # never run: the job's events are not read here
    try:
        job = Job(("p",), SamplingParams(max_tokens=10, temperature=0, top_k=0), 0.0, loop)
        output = JobOutput(job, ByteTokenizer())
        assert all(output.on_token(b) for b in "ñ€!".encode())
        assert output.text() == "ñ€!"
        assert output.pieces == ["ñ", "€", "!"]  # one piece per completed character
    finally:
        loop.close()


def test_issue_example_bytes_give_whole_characters() -> None:
    decoder = byte_decoder()
    assert [decoder.add(b) for b in b"\xc3\xb1\xe2\x82\xac"] == ["", "ñ", "", "", "€"]
    assert decoder.flush() == ""


@given(st.text(), st.lists(st.integers(min_value=0)))
def test_valid_utf8_is_never_split_or_replaced(text: str, cuts: list[int]) -> None:
    decoder = byte_decoder()  # st.text() has no lone surrogates: the bytes are valid UTF-8
    pieces = [decoder.add_many(chunk) for chunk in split(text.encode("utf-8"), cuts)]
    pieces.append(decoder.flush())
    assert "".join(pieces) == text
    assert sum(p.count("\ufffd") for p in pieces) == text.count("\ufffd")


@given(st.binary(), st.lists(st.integers(min_value=0)))
def test_any_bytes_decode_as_one_shot_replace(data: bytes, cuts: list[int]) -> None:
    decoder = byte_decoder()
    pieces = [decoder.add_many(chunk) for chunk in split(data, cuts)]
    pieces.append(decoder.flush())
    assert "".join(pieces) == data.decode("utf-8", errors="replace")


@given(st.binary())
def test_token_by_token_equals_one_shot_replace(data: bytes) -> None:
    decoder = byte_decoder()
    pieces = [decoder.add(b) for b in data]
    pieces.append(decoder.flush())
    assert "".join(pieces) == data.decode("utf-8", errors="replace")


def cut_at_first_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """Oracle: scan end positions in order; the first stop to complete (the longest if several
    end at the same place) cuts the text where it starts."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if s and text[:end].endswith(s)]
        if ending:
            return text[: end - max(map(len, ending))], True
    return text, False


ALPHABET = st.sampled_from("ab\nc")


@given(
    st.text(ALPHABET, max_size=30),
    st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=4),
    st.lists(st.integers(min_value=0), max_size=10),
)
def test_streamed_stops_cut_like_the_whole_text(text: str, stops: list[str], cuts: list[int]) -> None:
    matcher = StopMatcher(stops)
    sent = [matcher.feed(piece) for piece in split(text, cuts)]
    if not matcher.stopped:
        sent.append(matcher.flush())
    assert ("".join(sent), matcher.stopped) == cut_at_first_stop(text, stops)


def test_partial_stop_is_held_back_then_released() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.feed("abc E") == "abc "
    assert matcher.feed("N") == ""
    assert matcher.feed("x") == "ENx"
    assert matcher.feed("yEND tail") == "y"
    assert matcher.stopped
    assert matcher.feed("more") == ""


def test_no_stops_passes_text_through() -> None:
    matcher = StopMatcher([])
    assert matcher.feed("abc") == "abc"
    assert matcher.flush() == ""
