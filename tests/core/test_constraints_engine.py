"""A constraint through the engine: ``SamplingParams.constraint`` makes ``TokenSampler`` mask
each step with a ``ConstraintMatcher`` (never the simple or plain fast path), so
``model.generate(..., constraint=...)`` and ``BatchDecoder`` rows sampled by ``sample_rows``
produce text the independent oracle (``jsonschema``, ``re.fullmatch``) accepts; batched,
forked (n > 1) and preempted rows equal the same request alone; ``max_new_tokens`` before the
end leaves a cut prefix; bad combinations are KaelErrors naming the field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest

pytest.importorskip("llguidance")

import kael  # noqa: E402
from kael.constraints import ConstraintMatcher, choice, json_schema, regex  # noqa: E402
from kael.engine import SamplingParamError, SamplingParams, TokenSampler, sample_rows  # noqa: E402
from kael.models import GPT, BatchDecoder  # noqa: E402
from kael.tokenizer import BpeTokenizer  # noqa: E402

TOK_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "gpt2-tokenizer"

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 99},
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        "ok": {"type": "boolean"},
    },
    "required": ["id", "kind", "tags", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tok() -> BpeTokenizer:
    return BpeTokenizer.from_directory(TOK_DIR)


@pytest.fixture(scope="module")
def model(tok: BpeTokenizer) -> GPT:
    return GPT(tok.vocab_size, 64, 1, 2, 16, generator=kael.Generator().manual_seed(3))


@pytest.mark.parametrize("seed", range(6))
def test_generate_under_a_schema_validates_sampled_and_seeded(model: GPT, tok: BpeTokenizer, seed: int) -> None:
    eos = tok.eot_token

    def run() -> list[int]:
        g = kael.Generator().manual_seed(seed)
        c = json_schema(SCHEMA)
        return model.generate(tok.encode("Pet:"), 120, 1.0, generator=g, constraint=c, tokenizer=tok)

    out = run()
    assert out[-1] == eos and eos not in out[:-1], tok.decode(out)
    jsonschema.validate(json.loads(tok.decode(out[:-1])), SCHEMA)
    assert run() == out  # seeded: the same tokens again


def test_generate_under_a_regex_greedy_and_on_token_sees_every_token(model: GPT, tok: BpeTokenizer) -> None:
    seen: list[int] = []
    out = model.generate(
        tok.encode("Date:"), 40, on_token=seen.append, constraint=regex(r"20[0-9]{2}-[01][0-9]"), tokenizer=tok
    )
    assert seen == out and out[-1] == tok.eot_token
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]", tok.decode(out[:-1]).decode())


def test_max_new_tokens_before_the_end_leaves_a_cut_prefix(model: GPT, tok: BpeTokenizer) -> None:
    out = model.generate(tok.encode("Pet:"), 3, constraint=json_schema(SCHEMA), tokenizer=tok)
    assert len(out) == 3 and tok.eot_token not in out
    check = ConstraintMatcher(json_schema(SCHEMA), tok, tok.eot_token)
    for t in out:
        check.accept(t)  # every token was allowed: a prefix of a valid answer
    assert not check.is_accepting


def test_a_constrained_sampler_is_never_a_fast_path_and_its_mask_holds(tok: BpeTokenizer) -> None:
    params = SamplingParams(temperature=0, constraint=choice(["yes", "no"]))
    sampler = TokenSampler(params, end_tokens=[tok.eot_token], tokenizer=tok)
    assert not sampler.simple and not sampler.plain
    assert isinstance(sampler.matcher, ConstraintMatcher) and sampler.matcher in sampler.processors
    logits = np.zeros(tok.vocab_size)
    logits[tok.encode(" maybe")[0]] = 50.0  # the model's favourite is not allowed
    first = sampler(logits)
    assert tok.decode([first]).decode() in ("yes", "no", "y", "n")
    twin = sampler.fork()
    assert twin.matcher is not sampler.matcher and twin.matcher in twin.processors
    while True:
        t = sampler(np.zeros(tok.vocab_size))
        if t == tok.eot_token:
            break
    assert tok.decode(sampler.output[:-1]).decode() in ("yes", "no")
    assert twin.matcher.n_accepted == 1  # the fork did not move with the original
    sampler.rollback(len(sampler.output) - 1)
    assert sampler.matcher.n_accepted == 1 and sampler.output == [first]


def _alone(model: GPT, tok: BpeTokenizer, prompt: list[int], params: SamplingParams, seed: int, n: int) -> list[int]:
    s = TokenSampler(params, generator=kael.Generator().manual_seed(seed), end_tokens=[tok.eot_token], tokenizer=tok)
    engine = BatchDecoder(model, 1)
    token = s(engine.prefill(0, prompt))
    while len(s.output) < n and token != tok.eot_token:
        token = s(np.asarray(engine.decode([0], [token]))[0])
    return s.output


def test_batched_forked_and_preempted_rows_equal_alone(model: GPT, tok: BpeTokenizer) -> None:
    params = SamplingParams(temperature=1.0, constraint=json_schema(SCHEMA))
    prompts = [tok.encode("Pet:"), tok.encode("An animal, as JSON:")]
    eos, steps = tok.eot_token, 60
    engine = BatchDecoder(model, 4)
    samplers: list[TokenSampler] = []
    first = []
    for p, seed in enumerate((10, 20)):
        root = TokenSampler(params, generator=kael.Generator().manual_seed(seed), end_tokens=[eos], tokenizer=tok)
        samplers += [root, root.fork(kael.Generator().manual_seed(seed + 1))]  # n=2: choice i seeded seed + i
        first.append(np.asarray(engine.prefill(2 * p, prompts[p])))
        engine.fork(2 * p, 2 * p + 1)
    tokens = dict(enumerate(sample_rows(np.stack([first[0], first[0], first[1], first[1]]), samplers)))
    live = [r for r in range(4) if tokens[r] != eos]
    for step in range(1, steps):
        if step == 4 and 3 in live:  # row 3 preempted, resumed later from its prompt and tokens
            engine.preempt(3)
            live.remove(3)
        rows: dict[int, np.ndarray] = {}
        if live:
            rows.update(zip(live, np.asarray(engine.decode(live, [tokens[r] for r in live]))))
        if step == 7 and samplers[3].output[-1] != eos:
            rows[3] = np.asarray(engine.prefill(3, prompts[1] + samplers[3].output))
        order = sorted(rows)
        if order:
            picked = sample_rows(np.stack([rows[r] for r in order]), [samplers[r] for r in order])
            tokens.update(zip(order, picked))
        live = [r for r in order if tokens[r] != eos]
    for r, s in enumerate(samplers):
        p = r // 2
        assert s.output == _alone(model, tok, prompts[p], params, (10, 20)[p] + r % 2, steps)
        if s.output[-1] == eos:
            jsonschema.validate(json.loads(tok.decode(s.output[:-1])), SCHEMA)
    assert any(s.output[-1] == eos for s in samplers)


def test_bad_constraint_combinations_name_the_field(model: GPT, tok: BpeTokenizer) -> None:
    with pytest.raises(SamplingParamError, match="constraint") as e:
        SamplingParams(constraint={"type": "object"})
    assert e.value.field == "constraint"
    with pytest.raises(SamplingParamError, match="min_tokens") as e:
        SamplingParams(min_tokens=2, constraint=regex("a+"))
    assert e.value.field == "min_tokens"
    c = regex("a+")
    assert hash(SamplingParams(constraint=c)) == hash(SamplingParams(constraint=regex("a+")))
    with pytest.raises(kael.KaelError, match="tokenizer"):
        TokenSampler(SamplingParams(constraint=c), end_tokens=[0])
    with pytest.raises(kael.KaelError, match="end token"):
        TokenSampler(SamplingParams(constraint=c), tokenizer=tok)
    with pytest.raises(kael.KaelError, match="tokenizer"):
        model.generate([1], 2, constraint=c)
    with pytest.raises(kael.KaelError, match="not both"):
        model.generate([1], 2, sampler=lambda x, t: 0, constraint=c, tokenizer=tok)
