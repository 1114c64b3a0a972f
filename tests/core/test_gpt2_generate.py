"""GPT-2 (kael/models/): ``generate`` and ``sample_next``.

``on_token`` stops or continues generation, a tensor prompt is accepted and the training mode
restored, bad arguments and prompts raise a ``kael.KaelError`` subclass, sampling is seeded and
bounded by top-k, and ``sample_next`` is greedy with ties to the first index and follows the
softmax of the logits over temperature, restricted to the top k. Oracles: tests/data/tiny-gpt2's
greedy continuations, and a binomial bound on the sampled frequencies.
"""

from __future__ import annotations

import math
from typing import Any

import kael
import numpy as np
import pytest
from gpt2_reference import CASES
from gpt2_reference import tiny_gpt as _tiny
from kael.models import GPT, sample_next

# -- generate and sample_next -----------------------------------------------------------------------


def test_on_token_controls_generation(model: GPT) -> None:
    ids, want = CASES["prompt0"]["ids"], CASES["prompt0"]["greedy_20"]
    seen: list[int] = []
    assert model.generate(ids, 20, on_token=lambda t: seen.append(t)) == want == seen  # None continues
    seen.clear()
    assert model.generate(ids, 20, on_token=lambda t: seen.append(t) or len(seen) < 3) == want[:3] == seen
    assert model.generate(ids, 20, on_token=lambda t: 0) == want[:1]
    assert model.generate(ids, 20, on_token=lambda t: "yes") == want

    def boom(t: int) -> bool:
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        model.generate(ids, 20, on_token=boom)


def test_generate_accepts_a_tensor_prompt_and_restores_the_mode() -> None:
    m = _tiny()
    assert m.training
    out = m.generate(kael.tensor([3, 1, 4]), 6)
    assert m.training and len(out) == 6 and all(0 <= t < 97 for t in out)
    assert out == m.generate([3, 1, 4], 6)
    assert m.generate([3], 0) == []


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"temperature": 0.0005}, kael.KaelError),
        ({"temperature": -1.0}, kael.KaelError),
        ({"temperature": math.nan}, kael.KaelError),
        ({"temperature": math.inf}, kael.KaelError),
        ({"top_k": -1}, kael.KaelError),
        ({"top_k": 1.5}, kael.KaelError),
        ({"generator": 42}, kael.DTypeError),
        ({"max_new_tokens": -1}, kael.KaelError),
    ],
)
def test_generate_argument_errors(kwargs: dict[str, Any], error: type[Exception]) -> None:
    m = _tiny()
    args = {"max_new_tokens": 3, **kwargs}
    with pytest.raises(error):
        m.generate([1, 2], **args)


def test_generate_prompt_errors() -> None:
    m = _tiny()
    with pytest.raises(kael.KaelError, match="empty"):
        m.generate([], 3)
    with pytest.raises(kael.ShapeError, match="out of range"):
        m.generate([1, 97], 3)
    with pytest.raises(kael.DTypeError):
        m.generate([1, "a"], 3)


def test_sampling_is_seeded_and_top_k_bounds_it() -> None:
    m = _tiny(seed=1)

    def run(**kw: Any) -> list[int]:
        return m.generate([5, 6], 12, generator=kael.Generator().manual_seed(7), **kw)

    assert run(temperature=1.0) == run(temperature=1.0)
    assert run(temperature=1.0, top_k=97) == run(temperature=1.0, top_k=0) == run(temperature=1.0, top_k=500)
    assert run(temperature=2.0, top_k=1) == m.generate([5, 6], 12)  # top-1 is greedy
    assert run(temperature=0.0) == m.generate([5, 6], 12)


def test_sample_next_greedy_and_ties() -> None:
    logits = kael.tensor([0.5, 2.0, -1.0, 2.0])
    assert sample_next(logits) == 1
    assert sample_next(kael.tensor([[0.0, 1.0], [3.0, -3.0]])) == [1, 0]
    with pytest.raises(kael.ShapeError):
        sample_next(kael.tensor([1, 2]))


def test_sample_next_follows_softmax_with_top_k() -> None:
    logits = np.array([1.0, 0.0, 2.0, -1.0, 0.5], np.float32)
    t = 0.7
    g = kael.Generator().manual_seed(123)
    n = 4000
    counts = np.bincount([sample_next(kael.tensor(logits), t, 0, g) for _ in range(n)], minlength=5)
    p = np.exp(logits / t) / np.exp(logits / t).sum()
    assert np.abs(counts / n - p).max() < 4 * np.sqrt(p.max() * (1 - p.max()) / n)
    top = np.bincount([sample_next(kael.tensor(logits), t, 2, g) for _ in range(n)], minlength=5)
    assert set(np.nonzero(top)[0]) == {0, 2}  # only the two largest
    q = p[[0, 2]] / p[[0, 2]].sum()
    assert abs(top[0] / n - q[0]) < 4 * np.sqrt(q[0] * q[1] / n)
