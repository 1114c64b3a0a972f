"""kael.engine's one sampler: the top-k rule against Hugging Face's warper and PyTorch's topk,
seeded draws that neutral settings never change, the batched fast path, SamplingParams errors."""

from __future__ import annotations

import math
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kael.engine import SamplingParamError, SamplingParams, TokenSampler, filter_row, sample_rows, softmax
from kael.models import GPT, sample_next

V = 53


def _model() -> GPT:
    return GPT(V, 40, 2, 2, 16, generator=kael.Generator().manual_seed(11))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-6, 6), min_size=2, max_size=30),
    st.integers(1, 35),
    st.sampled_from([0.5, 1.0, 1.7]),
)
def test_top_k_is_hugging_faces_rule_ties_kept(torch: Any, ints: list[int], k: int, t: float) -> None:
    # small integer logits: ties at the k-th value are common
    from transformers import TopKLogitsWarper

    x = np.array(ints, dtype=np.float64) / 2
    ours = filter_row(x, t, k, 1.0, 0.0)
    scores = torch.tensor(x / t, dtype=torch.float64)[None]
    hf = TopKLogitsWarper(top_k=k)(torch.zeros(1, 1, dtype=torch.long), scores)[0].numpy()
    np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(hf))
    np.testing.assert_allclose(softmax(ours), torch.softmax(torch.tensor(hf), 0).numpy(), rtol=1e-12, atol=1e-15)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-20, 20), min_size=2, max_size=30, unique=True), st.integers(1, 35))
def test_without_ties_top_k_is_torch_topk_softmax(torch: Any, values: list[float], k: int) -> None:
    # what `probs = softmax(topk(x).values); multinomial(probs)` draws from, scattered back to ids
    x = np.array(values)
    probs = softmax(filter_row(x, 1.0, k, 1.0, 0.0))
    top = torch.topk(torch.tensor(x, dtype=torch.float64), min(k, len(values)))
    want = np.zeros_like(x)
    want[top.indices.numpy()] = torch.softmax(top.values, 0).numpy()
    np.testing.assert_allclose(probs, want, rtol=1e-12, atol=1e-15)


def test_a_seeded_request_ignores_neutral_top_p_and_top_k() -> None:
    model, prompt = _model(), [3, 1, 4]

    def run(**fields: Any) -> list[int]:
        sampler = TokenSampler(SamplingParams(temperature=0.9, **fields), prompt, kael.Generator().manual_seed(5))
        return model.generate(prompt, 20, sampler=sampler)

    base = run()
    for fields in ({"top_p": 1.0}, {"top_k": 0}, {"top_k": -1}, {"top_k": V}, {"top_k": V + 1000}):
        assert run(**fields) == base, fields
    # sample_next (generate's own sampling, the server's plain path) is the same sampler
    assert model.generate(prompt, 20, 0.9, V, generator=kael.Generator().manual_seed(5)) == base
    assert model.generate(prompt, 20, 0.9, 0, generator=kael.Generator().manual_seed(5)) == base
    assert run(top_k=5) == model.generate(prompt, 20, 0.9, 5, generator=kael.Generator().manual_seed(5))
    assert run(top_p=0.5) != base  # a real cut does change the draw


def test_batched_rows_sample_as_each_row_alone(rng: np.random.Generator) -> None:
    logits = rng.normal(size=(4, V)).astype(np.float32)
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.8, top_k=7),
        SamplingParams(temperature=1.2, top_p=0.9, presence_penalty=0.5),
        SamplingParams(temperature=0, logit_bias={int(np.argmax(logits[3])): -100.0}),
    ]

    def samplers() -> list[TokenSampler]:
        return [TokenSampler(p, generator=kael.Generator().manual_seed(i)) for i, p in enumerate(params)]

    batched, alone = samplers(), samplers()
    for _ in range(5):
        got = sample_rows(kael.tensor(logits), batched)
        assert got == [s(logits[i]) for i, s in enumerate(alone)]
        assert got[0] == int(np.argmax(logits[0])) and got[3] != int(np.argmax(logits[3]))
    # all greedy and plain: one argmax on the device, first on ties, as NumPy's
    ties = np.zeros((3, V), np.float32)
    ties[1, [4, 9]] = 2.0
    plain = [TokenSampler(SamplingParams(temperature=0)) for _ in range(3)]
    assert all(s.plain for s in plain)
    assert sample_rows(kael.tensor(ties), plain) == [0, 4, 0]
    assert [s.output for s in plain] == [[0], [4], [0]]


def test_sample_next_is_the_engine_draw() -> None:
    x = np.linspace(-2, 2, V).astype(np.float32)
    for top_k in (0, 3, V):
        a = [sample_next(kael.tensor(x), 0.7, top_k, g) for g in [kael.Generator().manual_seed(9)] for _ in range(30)]
        s = TokenSampler(SamplingParams(temperature=0.7, top_k=top_k), generator=kael.Generator().manual_seed(9))
        assert a == [s(x) for _ in range(30)]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"temperature": math.nan}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"min_p": 2}, "min_p"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"logit_bias": {"a": 1.0}}, "logit_bias"),
        ({"logit_bias": 3}, "logit_bias"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"seed": 1.5}, "seed"),
        ({"stop": ("",)}, "stop"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"logprobs": True}, "logprobs"),
    ],
)
def test_bad_fields_are_named(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(SamplingParamError, match=field) as info:
        SamplingParams(**fields)
    assert info.value.field == field and isinstance(info.value, kael.KaelError)


def test_logit_bias_is_stored_once_sorted() -> None:
    assert SamplingParams(logit_bias={5: 1, 2: -1.5}).logit_bias == ((2, -1.5), (5, 1.0))
    assert SamplingParams(logit_bias=[(5, 1.0), (2, -1.5)]) == SamplingParams(logit_bias={2: -1.5, 5: 1})
