"""GPT-2 (kael/models/): the KV cache.

Decoding with the cache equals recomputing the whole sequence, a reset reuses the cache's
memory, keys are written in place, a batch of prompts of different lengths equals each row
alone, ``decode_step`` (direct or through the general forward pass) equals the forward pass,
generation without fused kernels gives the reference tokens, and bad input to the forward pass
is refused. Oracles: the model's own forward pass without a cache, and tests/data/tiny-gpt2's
greedy continuations.
"""

from __future__ import annotations

import kael
import numpy as np
import pytest
from gpt2_reference import CASES
from gpt2_reference import logits_of as _logits
from gpt2_reference import tiny_gpt as _tiny
from kael.models import GPT, PagedKVCache

# -- the KV cache -------------------------------------------------------------------------------


def test_cache_decode_equals_full_recompute(model: GPT) -> None:
    ids = CASES["sliding_window"]["ids"][:40]
    full = _logits(model, [ids])[0]
    cache = model.new_cache()
    assert isinstance(cache, PagedKVCache) and cache.keys[0].shape == (1, 2, 64, 16)
    with kael.no_grad():
        parts = [model(kael.tensor([ids[:7]]), cache).numpy()[0]]  # prefill, then chunks and single tokens
        parts.append(model(kael.tensor([ids[7:10]]), cache).numpy()[0])
        for i in range(10, 40):
            parts.append(model(kael.tensor([[ids[i]]]), cache).numpy()[0])
    assert cache.lengths == [40]
    np.testing.assert_allclose(np.concatenate(parts), full, atol=2e-5, rtol=0)


def test_cache_reset_reuses_the_memory(model: GPT) -> None:
    cache = model.new_cache(batch=2, max_positions=8)
    ids = CASES["prompt1"]["ids"]
    with kael.no_grad():
        first = model(kael.tensor([ids, ids]), cache).numpy().copy()
        cache.reset(1)
        assert cache.lengths == [5, 0]
        cache.reset()
        again = model(kael.tensor([ids, ids]), cache).numpy()
    np.testing.assert_array_equal(first, again)
    assert "lengths=[5, 5]" in repr(cache)
    with pytest.raises(kael.ShapeError):
        cache.reset(2)
    with pytest.raises(kael.ShapeError, match="max_positions"):
        model.new_cache(max_positions=65)


def test_cache_holds_keys_in_place(model: GPT) -> None:
    cache = model.new_cache(max_positions=10)
    buffers = [b._storage for b in cache.data]
    with kael.no_grad():
        model(kael.tensor([[1, 2, 3]]), cache)
        model(kael.tensor([[4]]), cache)
    assert [b._storage for b in cache.data] == buffers
    k = cache.keys[1].numpy()
    assert np.abs(k[0, :, :4]).max() > 0 and np.abs(k[0, :, 4:]).max() == 0
    with kael.no_grad(), pytest.raises(kael.ShapeError, match="exceed"):
        model(kael.tensor([[1] * 7]), cache)


def test_batch_of_different_lengths_equals_each_row_alone(model: GPT) -> None:
    a = CASES["prompt2"]["ids"]  # 12 tokens
    b = CASES["prompt1"]["ids"]  # 5 tokens
    padded = [a, b + [0] * (len(a) - len(b))]
    cache = model.new_cache(batch=2)
    with kael.no_grad():
        first = model(kael.tensor(padded), cache, lengths=[len(a), len(b)]).numpy()
        last = model(kael.tensor(padded), lengths=[len(a), len(b)], last_only=True).numpy()
    assert cache.lengths == [12, 5]
    alone_a, alone_b = _logits(model, [a])[0], _logits(model, [b])[0]
    np.testing.assert_allclose(first[0], alone_a, atol=2e-5, rtol=0)
    np.testing.assert_allclose(first[1, :5], alone_b, atol=2e-5, rtol=0)
    np.testing.assert_allclose(last[:, 0], [alone_a[-1], alone_b[-1]], atol=2e-5, rtol=0)
    # decode both rows at their own positions (12 and 5), then 3 tokens each at once
    seq_a, seq_b = list(a), list(b)
    next_a, next_b = first[0, -1], first[1, len(b) - 1]
    with kael.no_grad():
        for _ in range(4):
            ta, tb = int(np.argmax(next_a)), int(np.argmax(next_b))
            seq_a.append(ta)
            seq_b.append(tb)
            step = model(kael.tensor([[ta], [tb]]), cache).numpy()
            np.testing.assert_allclose(step[0, 0], _logits(model, [seq_a])[0, -1], atol=2e-5, rtol=0)
            np.testing.assert_allclose(step[1, 0], _logits(model, [seq_b])[0, -1], atol=2e-5, rtol=0)
            next_a, next_b = step[0, 0], step[1, 0]
        more = model(kael.tensor([[5, 6, 7], [8, 9, 10]]), cache).numpy()
    assert cache.lengths == [19, 12]
    np.testing.assert_allclose(more[0], _logits(model, [seq_a + [5, 6, 7]])[0, -3:], atol=2e-5, rtol=0)
    np.testing.assert_allclose(more[1], _logits(model, [seq_b + [8, 9, 10]])[0, -3:], atol=2e-5, rtol=0)


@pytest.mark.parametrize("direct", [True, False])
def test_decode_step_equals_the_general_forward_pass(model: GPT, direct: bool) -> None:
    from kael.models import GenericStep, decode_step

    ids = CASES["sliding_window"]["ids"][:30]
    cache = model.new_cache(max_positions=30)
    with kael.no_grad():
        model(kael.tensor([ids[:10]]), cache)
        decoder = decode_step(model, cache, direct)
        assert isinstance(decoder, GenericStep) != direct
        steps = []
        for t in ids[10:]:
            steps.append(decoder([0], [t]).numpy()[0].copy())
            cache.lengths[0] += 1
    assert cache.lengths == [30]
    np.testing.assert_allclose(np.stack(steps), _logits(model, [ids])[0, 10:], atol=2e-5, rtol=0)
    with pytest.raises(kael.ShapeError, match="past the cache"):
        decoder([0], [1])


def test_generate_without_fused_kernels(model: GPT, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend without fused kernels: the general path with the frontend's decompositions."""
    from kael import _dispatch

    real = _dispatch.fused_kernel
    monkeypatch.setattr(
        _dispatch,
        "fused_kernel",
        lambda dev, op: None if op in ("linear", "layer_norm", "gelu", "attention", "embedding") else real(dev, op),
    )
    for name in ("prompt1", "sliding_window"):
        assert model.generate(CASES[name]["ids"], 20) == CASES[name]["greedy_20"]


def test_forward_input_errors(model: GPT) -> None:
    with pytest.raises(kael.DTypeError):
        model(kael.tensor([[1.0, 2.0]]))
    with pytest.raises(kael.ShapeError, match=r"\[batch, tokens\]"):
        model(kael.tensor([1, 2]))
    with pytest.raises(kael.ShapeError, match="context of 64"):
        model(kael.zeros(1, 65, dtype=kael.int64))
    with pytest.raises(kael.IndexError_):
        model(kael.tensor([[50257]]))
    with pytest.raises(kael.ShapeError, match="lengths"):
        model(kael.tensor([[1, 2]]), lengths=[3])
    with kael.no_grad(), pytest.raises(kael.ShapeError, match="2 rows"):
        model(kael.tensor([[1]]), model.new_cache(batch=2))


def test_cache_with_gradients_is_refused() -> None:
    m = _tiny()
    with pytest.raises(kael.AutogradError, match="no_grad"):
        m(kael.tensor([[1, 2]]), m.new_cache())
