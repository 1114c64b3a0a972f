"""kael.models sampling (kael/models/_sampling.py, over kael.engine's sampler) against straightforward NumPy/Python oracles.

Each oracle is written the plain way (a loop over tokens, a sorted list), independently of the
vectorised code: OpenAI's penalty formula, vLLM's repetition penalty, top-k/top-p/min-p as vLLM
defines them, log-softmax in math.fsum, the inverse-CDF draw from a twin generator.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kael.models import (
    GPT,
    SamplingParams,
    TokenLogprob,
    TokenSampler,
    apply_logit_bias,
    apply_penalties,
    filter_logits,
    log_softmax,
    prompt_logprobs,
    top_logprobs,
)

VOCAB = st.integers(2, 40)
LOGIT = st.floats(-30, 30, allow_nan=False, allow_infinity=False)


@st.composite
def rows(draw: Any, v: int | None = None) -> np.ndarray:
    n = draw(VOCAB) if v is None else v
    return np.array(draw(st.lists(LOGIT, min_size=n, max_size=n)), dtype=np.float64)


def oracle_log_softmax(x: list[float]) -> list[float]:
    m = max(x)
    total = math.fsum(math.exp(v - m) for v in x)
    return [v - m - math.log(total) for v in x]


def oracle_penalties(
    x: list[float], prompt: list[int], output: list[int], presence: float, frequency: float, repetition: float
) -> list[float]:
    out = []
    for j, logit in enumerate(x):
        c = output.count(j)
        if j in prompt or c > 0:
            logit = logit / repetition if logit > 0 else logit * repetition
        out.append(logit - c * frequency - (1.0 if c > 0 else 0.0) * presence)
    return out


def oracle_filter(x: list[float], temperature: float, top_k: int, top_p: float, min_p: float) -> list[float]:
    y = [v / temperature for v in x]
    if 0 < top_k < len(y):
        kth = sorted(y, reverse=True)[top_k - 1]
        y = [v if v >= kth else -math.inf for v in y]
    if top_p < 1:
        order = sorted(range(len(y)), key=lambda i: (-y[i], i))
        m = max(y)
        weights = [math.exp(y[i] - m) if y[i] > -math.inf else 0.0 for i in order]
        total = sum(weights)
        likelier = 0.0
        for i, w in zip(order, weights):
            if likelier >= top_p:
                y[i] = -math.inf
            likelier += w / total
    if min_p > 0:
        m = max(y)
        weights = [math.exp(v - m) if v > -math.inf else 0.0 for v in y]
        best = max(weights)
        y = [v if w >= min_p * best else -math.inf for v, w in zip(y, weights)]
    return y


# ---- the pieces ---------------------------------------------------------------------------


@given(rows())
def test_log_softmax_matches_the_oracle(x: np.ndarray) -> None:
    got = log_softmax(x)
    np.testing.assert_allclose(got, oracle_log_softmax(x.tolist()), rtol=1e-12, atol=1e-12)
    assert math.isclose(math.fsum(np.exp(got)), 1.0, rel_tol=1e-12)


def test_log_softmax_of_huge_logits_does_not_overflow() -> None:
    np.testing.assert_allclose(log_softmax(np.array([1000.0, 1000.0])), [-math.log(2)] * 2)
    with pytest.raises(kael.KaelError, match="no finite maximum"):
        log_softmax(np.array([np.nan, 1.0]))


@given(rows(), st.integers(0, 45))
def test_top_logprobs_are_the_largest_ties_to_the_lower_id(x: np.ndarray, n: int) -> None:
    x = np.round(x)  # many ties
    lp = log_softmax(x)
    want = sorted(range(len(lp)), key=lambda i: (-lp[i], i))[:n]
    assert [t for t, _ in top_logprobs(lp, n)] == want
    assert all(value == lp[t] for t, value in top_logprobs(lp, n))


@given(rows(), st.data())
def test_logit_bias_is_added(x: np.ndarray, data: Any) -> None:
    bias = data.draw(st.dictionaries(st.integers(0, len(x) - 1), st.floats(-100, 100), max_size=5))
    want = [v + bias.get(j, 0.0) for j, v in enumerate(x.tolist())]
    np.testing.assert_array_equal(apply_logit_bias(x, bias), want)


@given(
    rows(),
    st.data(),
    st.floats(-2, 2),
    st.floats(-2, 2),
    st.sampled_from([1.0, 0.5, 1.3, 2.0]),
)
def test_penalties_follow_openai_and_vllm(
    x: np.ndarray, data: Any, presence: float, frequency: float, repetition: float
) -> None:
    ids = st.integers(0, len(x) - 1)
    prompt = data.draw(st.lists(ids, max_size=8))
    output = data.draw(st.lists(ids, max_size=12))
    got = apply_penalties(
        x,
        prompt,
        output,
        presence_penalty=presence,
        frequency_penalty=frequency,
        repetition_penalty=repetition,
    )
    want = oracle_penalties(x.tolist(), prompt, output, presence, frequency, repetition)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_penalty_examples_by_hand() -> None:
    x = np.array([2.0, -2.0, 1.0, 0.5])
    # token 0 generated twice, token 1 once; token 2 only in the prompt
    got = apply_penalties(x, [2], [0, 1, 0], presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0)
    np.testing.assert_allclose(got, [2.0 / 2 - 0.5 - 0.5, -2.0 * 2 - 0.25 - 0.5, 1.0 / 2, 0.5])


@given(
    rows(),
    st.sampled_from([0.05, 0.5, 1.0, 1.7]),
    st.integers(-1, 45),
    st.floats(0.01, 1.0),
    st.floats(0.0, 1.0),
)
def test_filter_matches_vllm_definitions(x: np.ndarray, t: float, top_k: int, top_p: float, min_p: float) -> None:
    x = np.round(x, 1)  # ties at the cut-offs
    got = filter_logits(x, t, top_k, top_p, min_p)
    want = oracle_filter(x.tolist(), t, top_k, top_p, min_p)
    kept, kept_want = np.isfinite(got), np.isfinite(want)
    # near a top-p/min-p cut-off a rounding difference may move one token: compare only clear cases
    if not np.array_equal(kept, kept_want):
        (border,) = np.flatnonzero(kept != kept_want)
        assert _on_a_cut_off(x / t, top_k, top_p, min_p, int(border)), (got, want)
        return
    np.testing.assert_allclose(got[kept], np.array(want)[kept_want], rtol=1e-12)
    assert kept.any()  # at least the most likely token stays


def _on_a_cut_off(y: np.ndarray, top_k: int, top_p: float, min_p: float, token: int) -> bool:
    """Whether ``token`` sits within rounding of the top-p or min-p threshold (after top-k)."""
    if 0 < top_k < len(y):
        y = np.where(y >= np.sort(y)[::-1][top_k - 1], y, -np.inf)
    probs = np.exp(y - y.max())
    probs /= probs.sum()
    likelier = probs[(probs > probs[token]) | ((probs == probs[token]) & (np.arange(len(y)) < token))].sum()
    return abs(likelier - top_p) < 1e-9 or abs(probs[token] / probs.max() - min_p) < 1e-9


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert np.isfinite(filter_logits(x, 1.0, top_p=0.5)).tolist() == [True, False, False, False]
    assert np.isfinite(filter_logits(x, 1.0, top_p=0.51)).tolist() == [True, True, False, False]
    assert np.isfinite(filter_logits(x, 1.0, top_p=0.9)).tolist() == [True, True, True, False]
    assert np.isfinite(filter_logits(x, 1.0, min_p=0.5)).tolist() == [True, True, False, False]
    assert np.isfinite(filter_logits(x, 1.0, top_k=3)).tolist() == [True, True, True, False]


# ---- TokenSampler ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(2, 30))
def test_greedy_sampler_with_bias_and_penalties_equals_the_oracle_loop(data: Any, v: int) -> None:
    steps = data.draw(st.lists(rows(v), min_size=1, max_size=8))
    prompt = data.draw(st.lists(st.integers(0, v - 1), max_size=6))
    bias = data.draw(st.dictionaries(st.integers(0, v - 1), st.floats(-5, 5), max_size=3))
    presence, frequency = data.draw(st.floats(-2, 2)), data.draw(st.floats(-2, 2))
    repetition = data.draw(st.sampled_from([1.0, 0.7, 1.5]))
    options = SamplingParams(
        temperature=0,
        logit_bias=bias,
        presence_penalty=presence,
        frequency_penalty=frequency,
        repetition_penalty=repetition,
        logprobs=2,
    )
    sampler = TokenSampler(options, prompt)
    output: list[int] = []
    for x in steps:
        biased = [value + bias.get(j, 0.0) for j, value in enumerate(x.tolist())]
        processed = oracle_penalties(biased, prompt, output, presence, frequency, repetition)
        best = max(processed)
        want = processed.index(best)
        got = sampler(x, prompt + output)
        if got != want:  # only an exact or rounding tie may differ
            assert math.isclose(processed[got], best, abs_tol=1e-9)
        assert sampler.last is not None and sampler.last.token == got
        lp = oracle_log_softmax(x.tolist())
        assert math.isclose(sampler.last.logprob, lp[got], abs_tol=1e-12)  # the model's own logprob
        assert [t for t, _ in sampler.last.top] == sorted(range(v), key=lambda i: (-lp[i], i))[:2]
        output.append(got)
    assert sampler.generated == len(steps)


@settings(max_examples=40, deadline=None)
@given(
    rows(),
    st.integers(0, 2**32),
    st.sampled_from([0.3, 1.0, 2.5]),
    st.integers(0, 6),
    st.floats(0.05, 1.0),
    st.floats(0.0, 0.5),
)
def test_sampled_token_is_the_inverse_cdf_of_a_twin_generators_draw(
    x: np.ndarray, seed: int, t: float, top_k: int, top_p: float, min_p: float
) -> None:
    options = SamplingParams(temperature=t, top_k=top_k, top_p=top_p, min_p=min_p)
    sampler = TokenSampler(options, generator=kael.Generator().manual_seed(seed))
    twin = kael.Generator().manual_seed(seed)
    for _ in range(3):
        got = sampler(x)
        u = float(kael.rand(1, dtype=kael.float64, generator=twin).item())
        filtered = np.array(oracle_filter(x.tolist(), t, top_k, top_p, min_p))
        probs = np.exp(filtered - filtered.max())
        probs /= probs.sum()
        cdf = np.cumsum(probs)
        want = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        if got != want:  # a draw on a boundary the two roundings place apart
            assert abs(u * cdf[-1] - cdf[min(got, want)]) < 1e-9
        assert probs[got] > 0


def test_sampling_frequencies_follow_the_filtered_distribution() -> None:
    x = np.log(np.array([0.4, 0.3, 0.2, 0.06, 0.04]))
    sampler = TokenSampler(SamplingParams(temperature=1.0, top_p=0.85), generator=kael.Generator().manual_seed(3))
    counts = Counter(sampler(x) for _ in range(4000))
    assert set(counts) == {0, 1, 2}  # 0.4 + 0.3 < 0.85: the third is needed, the rest dropped
    for token, p in ((0, 0.4 / 0.9), (1, 0.3 / 0.9), (2, 0.2 / 0.9)):
        assert abs(counts[token] / 4000 - p) < 0.03


def test_the_same_seed_gives_the_same_tokens() -> None:
    x = np.linspace(-1, 1, 17)

    def run(seed: int) -> list[int]:
        options = SamplingParams(temperature=1.3, frequency_penalty=0.4, top_k=9)
        sampler = TokenSampler(options, generator=kael.Generator().manual_seed(seed))
        return [sampler(x) for _ in range(20)]

    assert run(11) == run(11) != run(12)


def test_min_tokens_masks_the_stop_tokens_until_then() -> None:
    x = np.array([0.0, 0.0, 10.0])  # token 2 (the stop token) is by far the likeliest
    sampler = TokenSampler(SamplingParams(temperature=0, min_tokens=3, stop_token_ids=(2,)))
    assert [sampler(x) for _ in range(5)] == [0, 0, 0, 2, 2]
    sampled = TokenSampler(
        SamplingParams(temperature=1.0, min_tokens=50, stop_token_ids=(2,)), generator=kael.Generator().manual_seed(0)
    )
    assert 2 not in [sampled(x) for _ in range(50)]


def test_logit_bias_forces_or_bans_a_token() -> None:
    x = np.array([3.0, 1.0, 0.0, -1.0])
    forced = TokenSampler(SamplingParams(temperature=1.0, logit_bias={3: 100}), generator=kael.Generator())
    assert {forced(x) for _ in range(50)} == {3}
    banned = TokenSampler(SamplingParams(temperature=0, logit_bias={0: -100}))
    assert banned(x) == 1


def test_sampler_drives_generate() -> None:
    model = GPT(31, 24, 2, 2, 16, generator=kael.Generator().manual_seed(4))
    prompt = [1, 2, 3]
    greedy = model.generate(prompt, 10)
    assert model.generate(prompt, 10, sampler=TokenSampler(SamplingParams(temperature=0), prompt)) == greedy
    # a repetition penalty changes the greedy path exactly as the oracle loop says
    options = SamplingParams(temperature=0, repetition_penalty=1.8, frequency_penalty=0.3)
    got = model.generate(prompt, 10, sampler=TokenSampler(options, prompt))
    seq = list(prompt)
    for _ in range(10):
        logits = np.asarray(model(kael.tensor([seq], dtype=kael.int64)))[0, -1].tolist()
        processed = oracle_penalties(logits, prompt, seq[len(prompt) :], 0.0, 0.3, 1.8)
        seq.append(processed.index(max(processed)))
    assert got == seq[len(prompt) :]


def test_prompt_logprobs_match_prefix_by_prefix_forward_passes() -> None:
    model = GPT(29, 16, 2, 2, 16, generator=kael.Generator().manual_seed(9))
    ids = [5, 0, 28, 7, 7, 3]
    got = prompt_logprobs(model, ids, top_n=3)
    assert got[0] is None and len(got) == len(ids)
    for k in range(1, len(ids)):
        logits = np.asarray(model(kael.tensor([ids[:k]], dtype=kael.int64)))[0, -1].astype(np.float64)
        lp = oracle_log_softmax(logits.tolist())
        entry = got[k]
        assert isinstance(entry, TokenLogprob) and entry.token == ids[k]
        assert math.isclose(entry.logprob, lp[ids[k]], abs_tol=1e-5)
        assert [t for t, _ in entry.top] == sorted(range(29), key=lambda i: (-lp[i], i))[:3]
    assert prompt_logprobs(model, [4]) == [None]


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": 0.0001}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"presence_penalty": math.nan}, "presence_penalty"),
        ({"frequency_penalty": math.inf}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {1: math.nan}}, "logit_bias"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"stop_token_ids": (True,)}, "stop_token_ids"),
        ({"logprobs": -1}, "logprobs"),
    ],
)
def test_bad_options_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(kael.KaelError, match=field):
        SamplingParams(**options)


def test_ids_out_of_the_vocabulary_and_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(kael.ShapeError, match="logit_bias: token id 9 is out of range for a vocabulary of 4"):
        TokenSampler(SamplingParams(logit_bias={9: 1.0}))(np.zeros(4))
    with pytest.raises(kael.ShapeError, match="token id 7 is out of range"):
        TokenSampler(SamplingParams(repetition_penalty=1.2), prompt=[7])(np.zeros(4))
    with pytest.raises(kael.ShapeError, match=r"one row \[V\]"):
        TokenSampler(SamplingParams(temperature=0))(np.zeros((2, 3)))
    with pytest.raises(kael.DTypeError, match="generator"):
        TokenSampler(SamplingParams(), generator=object())  # type: ignore[arg-type]
    with pytest.raises(kael.KaelError, match="no valid"):
        TokenSampler(SamplingParams(temperature=0))(np.array([np.nan, np.nan]))
    sampler = TokenSampler(SamplingParams(temperature=0))
    sampler(np.zeros(4))
    with pytest.raises(kael.ShapeError, match="a step of 5 logits after steps of 4"):
        sampler(np.zeros(5))


def test_logits_a_tiny_repetition_penalty_makes_infinite_still_sample() -> None:
    # 2.0 / 1e-308 overflows to +inf: that token (the only seen one with a positive logit) is certain
    x = np.array([2.0, 1.0, -1.0, 0.5])
    options = SamplingParams(temperature=0.7, repetition_penalty=1e-308, top_p=0.9, min_p=0.1)
    sampler = TokenSampler(options, prompt=[0, 2], generator=kael.Generator().manual_seed(1))
    assert {sampler(x) for _ in range(20)} == {0}
    assert TokenSampler(SamplingParams(temperature=0, repetition_penalty=1e-308), prompt=[1])(x) == 1
