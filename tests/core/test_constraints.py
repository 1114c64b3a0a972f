"""kael.constraints: random walks under each constraint kind produce text the independent
oracle accepts (``jsonschema``, ``re.fullmatch``, equality), fork and rollback give the masks
of a fresh matcher fed the same tokens, and bad constraints raise ConstraintError naming the
field."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("llguidance")

from kael.constraints import (  # noqa: E402
    ConstraintError,
    ConstraintMatcher,
    Limits,
    allowed_ids,
    choice,
    fill_bitmasks,
    grammar,
    json_object,
    json_schema,
    new_bitmask,
    regex,
)
from kael.engine.logits_processors import LogitsProcessor  # noqa: E402
from kael.tokenizer import BpeTokenizer  # noqa: E402

TOK_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "gpt2-tokenizer"

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
    },
    "required": ["name", "age", "ok", "color", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tok() -> BpeTokenizer:
    return BpeTokenizer.from_directory(TOK_DIR)


def walk(m: ConstraintMatcher, tok: BpeTokenizer, seed: int, limit: int = 400) -> str:
    """Random allowed tokens (seeded) until the end token: the generated text."""
    rng = np.random.default_rng(seed)
    eos = tok.eot_token
    out: list[int] = []
    for _ in range(limit):
        ids = m.allowed()
        assert ids.size > 0
        if eos in ids and (ids.size == 1 or rng.random() < 0.5):
            return tok.decode(out).decode()
        t = int(rng.choice(ids[ids != eos]))
        m.accept(t)
        out.append(t)
    pytest.fail(f"no end after {limit} tokens: {tok.decode(out)!r}")


_examples = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_examples
@given(seed=st.integers(0, 2**32 - 1))
def test_json_schema_walk_validates(tok: BpeTokenizer, seed: int) -> None:
    text = walk(ConstraintMatcher(json_schema(SCHEMA), tok, tok.eot_token), tok, seed)
    jsonschema.validate(json.loads(text), SCHEMA)


@_examples
@given(seed=st.integers(0, 2**32 - 1))
@example(seed=94083)  # (with \d, this walk wrote U+1CCF1, a digit of Unicode 16 that Python 3.11's re does not know)
def test_regex_walk_fullmatches(tok: BpeTokenizer, seed: int) -> None:
    r"""[0-9], not \d: \d is Unicode's digit class of the regex crate's Unicode version (16), larger than that of
    the oracle's (Python 3.11: Unicode 14), so a walk may write a digit that re does not count as one."""
    pattern = r"([0-9]{1,3}\.){3}[0-9]{1,3}|[a-z]{2,5}@[a-z]{1,4}\.(com|org)"
    text = walk(ConstraintMatcher(regex(pattern), tok, tok.eot_token), tok, seed)
    assert re.fullmatch(pattern, text), text


@_examples
@given(seed=st.integers(0, 2**32 - 1), options=st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=5))
def test_choice_walk_is_an_option(tok: BpeTokenizer, seed: int, options: list[str]) -> None:
    options = [
        o for o in options if "\x00" not in o and o.encode("utf-8", "surrogatepass").decode("utf-8", "ignore") == o
    ] or ["x"]
    text = walk(ConstraintMatcher(choice(options), tok, tok.eot_token), tok, seed)
    assert text in options


def test_json_object_and_grammars(tok: BpeTokenizer) -> None:
    for seed in range(3):
        m = ConstraintMatcher(json_object(), tok, tok.eot_token)
        # force an empty-or-short object by walking with a cap on choices: the first token must open an object
        assert set(tok.decode([int(i)]).decode("utf-8", "replace").strip()[:1] for i in m.allowed()) <= {"{", ""}
    lark = 'start: "answer: " ("yes" | "no") "."'
    gbnf = 'root ::= "answer: " ("yes" | "no") "."'
    for g in (lark, gbnf):
        for seed in range(4):
            assert walk(ConstraintMatcher(grammar(g), tok, tok.eot_token), tok, seed) in {"answer: yes.", "answer: no."}


def test_fork_and_rollback_match_a_fresh_matcher(tok: BpeTokenizer) -> None:
    c = json_schema(SCHEMA)
    rng = np.random.default_rng(7)
    m = ConstraintMatcher(c, tok, tok.eot_token)
    fed: list[int] = []
    for _ in range(12):
        ids = m.allowed()
        t = int(rng.choice(ids[ids != tok.eot_token]))
        m.accept(t)
        fed.append(t)
    f = m.fork()
    # the fork goes its own way: the original is untouched
    f.accept(int(f.allowed()[-1]))
    f.accept(int(f.allowed()[0]))

    def fresh(tokens: list[int]) -> np.ndarray:
        x = ConstraintMatcher(c, tok, tok.eot_token)
        for t in tokens:
            x.accept(t)
        return x.allowed()

    np.testing.assert_array_equal(m.allowed(), fresh(fed))
    m.rollback(5)
    assert m.n_accepted == 7
    np.testing.assert_array_equal(m.allowed(), fresh(fed[:7]))
    f.rollback(2)
    np.testing.assert_array_equal(f.allowed(), fresh(fed))
    with pytest.raises(ConstraintError, match="cannot roll back 8 tokens, 7 accepted"):
        m.rollback(8)


def test_apply_masks_to_minus_inf_and_is_a_logits_processor(tok: BpeTokenizer) -> None:
    m = ConstraintMatcher(choice(["yes", "no"]), tok, tok.eot_token)
    assert isinstance(m, LogitsProcessor)
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(tok.vocab_size + 11)  # a padded model row
    before = logits.copy()
    m.apply(logits, [])
    allowed = m.allowed()
    expect = np.full_like(before, -math.inf)
    expect[allowed] = before[allowed]
    np.testing.assert_array_equal(logits, expect)
    assert {tok.decode([int(i)]).decode() for i in allowed} <= {"y", "ye", "yes", "n", "no"}
    with pytest.raises(ConstraintError, match="choice: token .* is not allowed"):
        m.accept(tok.encode("maybe")[0])


def test_fill_bitmasks_equals_per_row(tok: BpeTokenizer) -> None:
    ms = [ConstraintMatcher(json_schema(SCHEMA), tok, tok.eot_token) for _ in range(3)]
    ms.append(ConstraintMatcher(regex(r"[0-9]+"), tok, tok.eot_token))
    ms[1].accept(tok.encode("{")[0])
    bm = new_bitmask(len(ms), tok.vocab_size)
    fill_bitmasks(ms, bm)
    for i, m in enumerate(ms):
        np.testing.assert_array_equal(allowed_ids(bm[i], tok.vocab_size), m.allowed())


def test_limits_and_malformed_constraints_name_the_field(tok: BpeTokenizer) -> None:
    small = Limits(schema_bytes=200, nesting_depth=4, grammar_bytes=50, regex_bytes=10, choices=2)
    with pytest.raises(
        ConstraintError, match=r"response_format\.json_schema\.schema: schema is \d+ bytes, at most 200"
    ):
        json_schema({"type": "object", "description": "x" * 300}, limits=small)
    deep: dict = {"type": "string"}
    for _ in range(5):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(ConstraintError, match="nests .* levels deep, at most 4"):
        json_schema(deep, limits=Limits(nesting_depth=4))
    with pytest.raises(ConstraintError, match="schema: not valid JSON"):
        json_schema('{"type": ')
    with pytest.raises(ConstraintError, match="must be an object, got list"):
        json_schema("[1]")
    with pytest.raises(ConstraintError, match=r"tools\[0\]\.parameters: invalid json schema"):
        ConstraintMatcher(json_schema({"type": "no-such-type"}, field="tools[0].parameters"), tok, tok.eot_token)
    with pytest.raises(ConstraintError, match="guided_regex: regex is 11 bytes, at most 10"):
        regex("a" * 11, field="guided_regex", limits=small)
    with pytest.raises(ConstraintError, match="(?s)regex: invalid regex.*unclosed group"):
        ConstraintMatcher(regex("a(b"), tok, tok.eot_token)
    with pytest.raises(ConstraintError, match=r"choice\[1\]: expected a string, got int"):
        choice(["a", 3])  # type: ignore[list-item]
    with pytest.raises(ConstraintError, match="3 choices, at most 2"):
        choice(["a", "b", "c"], limits=small)
    with pytest.raises(ConstraintError, match="grammar: grammar is 51 bytes, at most 50"):
        grammar("x" * 51, limits=small)
    with pytest.raises(ConstraintError, match="grammar: invalid grammar"):
        ConstraintMatcher(grammar("start: undefined_rule"), tok, tok.eot_token)


def test_compile_cache_gives_independent_matchers(tok: BpeTokenizer) -> None:
    a = ConstraintMatcher(regex("ab|ac"), tok, tok.eot_token)
    a.accept(tok.encode("a")[0])
    b = ConstraintMatcher(regex("ab|ac"), tok, tok.eot_token)  # from the cache
    assert b.n_accepted == 0
    assert tok.encode("a")[0] in b.allowed()
    assert tok.encode("a")[0] not in a.allowed()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_generate_of_a_random_gpt_under_a_schema_validates(tok: BpeTokenizer, seed: int) -> None:
    import kael
    from kael.constraints import constrained_sampler, stop_at_end
    from kael.models import GPT

    model = GPT(tok.vocab_size, 256, 1, 2, 16, generator=kael.Generator().manual_seed(seed))
    eos = tok.eot_token
    m = ConstraintMatcher(json_schema(SCHEMA), tok, eos)
    prompt = tok.encode("JSON:")
    out = model.generate(prompt, 200, sampler=constrained_sampler(m, eos), on_token=stop_at_end(eos))
    assert out[-1] == eos, tok.decode(out)
    jsonschema.validate(json.loads(tok.decode(out[:-1])), SCHEMA)
    # the same tokens, greedy on the masked logits: the sampler took the allowed argmax each step
    check = ConstraintMatcher(json_schema(SCHEMA), tok, eos)
    for t in out[:-1]:
        check.accept(t)
    assert check.is_accepting
