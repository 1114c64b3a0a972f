"""``generate(..., speculative=...)`` (kael/models/_generate_speculative.py): the same tokens as
``generate`` without it (the oracle), greedy and seeded, with prompt lookup and with a draft
model, on a random GPT-2 and a random Llama; ``on_token`` stops as it does without it; bad
settings are KaelErrors naming the argument."""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
from kael import KaelError
from kael.engine import DraftModelProposer, NgramProposer, SamplingParams, Speculator, TokenSampler
from tiny_causal_lms import CTX, V, tiny_causal_lm


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def model(request: pytest.FixtureRequest) -> Any:
    return tiny_causal_lm(request.param)


def _prompt(seed: int) -> list[int]:
    phrase = np.random.default_rng(seed).integers(0, V, size=6).tolist()
    return phrase * 3 + [int(phrase[0])]


@pytest.mark.parametrize("how", ["ngram", "proposer", "speculator", "draft"])
def test_greedy_tokens_are_those_without_it(model: Any, how: str) -> None:
    prompt = _prompt(1)
    spec: Any = {
        "ngram": "ngram",
        "proposer": NgramProposer(n_max=2, k=3),
        "speculator": Speculator(NgramProposer(), warmup=0),
        "draft": DraftModelProposer(model, k=3, rows=1, target=model),
    }[how]
    assert model.generate(prompt, 30, speculative=spec) == model.generate(prompt, 30)
    if how == "speculator":
        assert spec.proposed > 0


def test_seeded_tokens_are_those_without_it(model: Any) -> None:
    prompt = _prompt(2)
    plain = model.generate(prompt, 30, temperature=0.9, top_k=20, generator=kael.Generator().manual_seed(4))
    spec = model.generate(
        prompt, 30, temperature=0.9, top_k=20, generator=kael.Generator().manual_seed(4), speculative="ngram"
    )
    assert spec == plain


def test_on_token_stops_as_without_it(model: Any) -> None:
    prompt = _prompt(3)
    seen: list[list[int]] = [[], []]
    for i, spec in enumerate((None, "ngram")):
        out = model.generate(prompt, 30, on_token=lambda t, s=seen[i]: s.append(t) or len(s) < 7, speculative=spec)
        assert out == seen[i] and len(out) == 7
    assert seen[0] == seen[1]


def test_bad_settings_are_refused(model: Any) -> None:
    with pytest.raises(KaelError, match="speculative must be 'ngram', a kael.engine.Proposer"):
        model.generate([1, 2, 3], 4, speculative="medusa")
    with pytest.raises(KaelError, match=r"must fit the model's context of 96 positions"):
        model.generate([1, 2, 3], CTX, speculative="ngram")
    with pytest.raises(KaelError, match="takes no constraint, and of samplers only a kael.engine.TokenSampler"):
        model.generate([1, 2, 3], 4, sampler=lambda logits, ids: 0, speculative="ngram")


def test_a_token_sampler_samples_as_without_it(model: Any) -> None:
    """A TokenSampler (top_p, min_p, ...) samples each verified position as plain decoding samples one step
    after another, and forgets rejected drafts: the same tokens, seed for seed."""
    prompt = _prompt(5) * 2  # a repeat, so the n-gram proposer drafts
    for seed in (1, 2, 3):
        params = SamplingParams(temperature=0.9, top_p=0.8, min_p=0.02)
        outs = [
            model.generate(
                prompt, 24, sampler=TokenSampler(params, generator=kael.Generator().manual_seed(seed)), speculative=spec
            )
            for spec in (None, "ngram")
        ]
        assert outs[0] == outs[1] and len(outs[0]) == 24
