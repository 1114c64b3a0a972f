"""kael.engine's one stop function (SequenceStop) against a plain oracle over the whole sequence:
end tokens, ignore_eos, stop_token_ids, min_tokens, stop strings and max_tokens."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kael.engine import SamplingParams, SequenceStop

EOS = 9
TURN = 8
LETTERS = "abc"  # token t < 3 is the letter LETTERS[t]; 8 and 9 show no text


def oracle(tokens: list[int], params: SamplingParams) -> tuple[str, str, int]:
    """(text, finish reason, tokens of the text) read off the whole sequence at once."""
    text, count = "", 0
    for produced, t in enumerate(tokens, 1):
        if t in params.stop_token_ids or (t == EOS and not params.ignore_eos):
            return text, "stop", count
        count += 1
        text += LETTERS[t] if t < 3 else ""
        # a stop string counts only in the text from token min_tokens on (what came before was sent
        # as it was); the text is cut where the stop that completes first starts
        if count >= params.min_tokens:
            sent = len(_text(tokens[: max(params.min_tokens - 1, 0)]))
            tail = text[sent:]
            hits = [(tail.find(s) + len(s), tail.find(s)) for s in params.stop if s in tail]
            if hits:
                return text[: sent + min(hits)[1]], "stop", count
        if produced >= params.max_tokens:
            return text, "length", count
    return text, "length", count


def _text(tokens: list[int]) -> str:
    return "".join(LETTERS[t] if t < 3 else "" for t in tokens)


def run(tokens: list[int], params: SamplingParams) -> tuple[str, str, int]:
    stop, sent = SequenceStop(params, eos_ids=(EOS,)), ""
    for t in tokens:
        if not stop.token(t):
            break
        sent += stop.text("" if stop.silent(t) else (LETTERS[t] if t < 3 else ""))
        if stop.done:
            break
    sent += stop.flush()
    return sent, stop.finish_reason, stop.generated


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([0, 1, 2, TURN, EOS]), min_size=1, max_size=20),
    st.lists(st.text("abc", min_size=1, max_size=3), max_size=2),
    st.integers(0, 4),
    st.booleans(),
    st.booleans(),
    st.integers(1, 20),
)
def test_stop_matches_the_whole_sequence_oracle(
    tokens: list[int], stops: list[str], min_tokens: int, ignore_eos: bool, turn: bool, max_tokens: Any
) -> None:
    params = SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min(min_tokens, max_tokens),
        stop=tuple(stops),
        ignore_eos=ignore_eos,
        stop_token_ids=(TURN,) if turn else (),
    )
    assert run(tokens, params) == oracle(tokens, params)


def test_examples_by_hand() -> None:
    assert run([0, 1, EOS, 2], SamplingParams()) == ("ab", "stop", 2)
    assert run([0, 1, EOS, 2], SamplingParams(ignore_eos=True)) == ("abc", "length", 4)
    # ignore_eos ignores the model's end ids only: an end-of-turn id still ends it (vLLM's rule)
    assert run([0, TURN, 1], SamplingParams(ignore_eos=True, stop_token_ids=(TURN,))) == ("a", "stop", 1)
    assert run([0, 1, 2, 0], SamplingParams(stop=("bc",))) == ("a", "stop", 3)
    assert run([0, 1, 2, 0], SamplingParams(stop=("ab",), min_tokens=2)) == ("abca", "length", 4)
    assert run([0, 1, 2, 0], SamplingParams(max_tokens=2)) == ("ab", "length", 2)
