"""BatchDecoder (kael/models/_batched.py): sequences decoded together give what each gives alone.

Oracle: ``model.generate`` on each prompt alone (and, for the logits, generate's own prefill
and one-row decode step), on the tiny reference checkpoint (top-1/top-2 gaps >= 0.002 along its
greedy continuations) and on random models. Sequences join at different steps, leave early,
and reuse each other's rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import kael
import numpy as np
import pytest
from kael import _dispatch
from kael.models import GPT, BatchDecoder
from kael.models._generate import _prefill

DATA = Path(__file__).resolve().parent.parent / "data" / "tiny-gpt2"
REF = json.loads((DATA / "reference.json").read_text())


def _random_model(seed: int, vocab: int = 97, ctx: int = 48, layers: int = 2, heads: int = 4, dim: int = 32) -> GPT:
    return GPT(vocab, ctx, layers, heads, dim, generator=kael.Generator().manual_seed(seed))


def _reference_backend() -> bool:
    return _dispatch.backend_for("cpu").name == "reference"


def _run(
    engine: BatchDecoder,
    prompts: Sequence[list[int]],
    n: int,
    joins: Sequence[int],
    rows: Sequence[int],
    stop_after: Sequence[int] | None = None,
    seeds: Sequence[int | None] | None = None,
    temperature: float = 0.0,
    together: bool = False,
) -> list[list[int]]:
    """Continuous batching by hand: prompt i joins before step joins[i] in row rows[i] (several may
    share a row, one after the other) and leaves after n tokens (or stop_after[i]). With
    ``together``, the prompts joining at one step are prefilled in one ``prefill_many`` call."""
    want = [n if stop_after is None else stop_after[i] for i in range(len(prompts))]
    gens = [
        None if seeds is None or s is None else kael.Generator().manual_seed(s)
        for s in (seeds or [None] * len(prompts))
    ]
    out: list[list[int]] = [[] for _ in prompts]
    waiting = list(range(len(prompts)))
    running: list[int] = []
    step = 0
    while waiting or running:
        joining: list[int] = []
        for i in waiting:
            if joins[i] <= step and all(rows[j] != rows[i] for j in running + joining) and engine.length(rows[i]) == 0:
                joining.append(i)
        if together and joining:
            firsts = engine.prefill_many([rows[i] for i in joining], [prompts[i] for i in joining])
            assert firsts.shape == (len(joining), engine.vocab_size)
            for j, i in enumerate(joining):
                out[i].append(engine.sample(kael.select(firsts, 0, j), temperature, 0, gens[i]))
        for i in joining:
            waiting.remove(i)
            if not together:
                out[i].append(engine.sample(engine.prefill(rows[i], prompts[i]), temperature, 0, gens[i]))
            running.append(i)
        for i in [i for i in running if len(out[i]) >= want[i]]:
            running.remove(i)
            engine.release(rows[i])
        if running:
            logits = engine.decode([rows[i] for i in running], [out[i][-1] for i in running])
            assert logits.shape == (len(running), engine.vocab_size)
            for j, i in enumerate(running):
                out[i].append(engine.sample(kael.select(logits, 0, j), temperature, 0, gens[i]))
        step += 1
    return out


@pytest.fixture(scope="module")
def tiny() -> GPT:
    return GPT.from_pretrained(DATA)


@pytest.mark.parametrize("paged", [True, False])
@pytest.mark.parametrize("together", [False, True])
@pytest.mark.parametrize("direct", [True, False])
def test_greedy_batched_equals_alone_on_the_reference_checkpoint(
    tiny: GPT, direct: bool, together: bool, paged: bool
) -> None:
    cases = [c for c in REF["cases"] if len(c["ids"]) + 20 <= tiny.max_positions]
    prompts = [c["ids"] for c in cases] + [cases[0]["ids"][:1], cases[-1]["ids"] + cases[0]["ids"]]
    alone = [tiny.generate(p, 20) for p in prompts]
    for c, a in zip(cases, alone):
        assert a == c["greedy_20"]  # the oracle itself is right
    engine = BatchDecoder(tiny, rows=3, direct=direct, paged=paged)  # paged=False: one block per row
    assert engine.paged is paged
    joins, rows = [0, 2, 2, 5, 9][: len(prompts)], [1, 0, 2, 1, 0][: len(prompts)]
    got = _run(engine, prompts, 20, joins=joins, rows=rows, together=together)
    assert got == alone


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_batched_equals_alone_on_random_models(seed: int) -> None:
    model = _random_model(seed)
    rng = np.random.default_rng(seed)
    prompts = [[int(t) for t in rng.integers(0, 97, size=k)] for k in (1, 6, 11, 3, 17, 2)]
    alone = [model.generate(p, 16) for p in prompts]
    for together in (False, True):
        engine = BatchDecoder(model, rows=4)
        got = _run(engine, prompts, 16, joins=[0, 0, 1, 4, 6, 6], rows=[3, 0, 1, 2, 3, 0], together=together)
        assert got == alone


def test_logits_match_alone_and_leavers_do_not_disturb_the_others() -> None:
    model = _random_model(5, dim=64)
    prompts = [[1, 2, 3], [5] * 9, [7, 8], [9] * 20]
    steps = {0: 10, 1: 3, 2: 10, 3: 6}  # rows 1 and 3 leave early
    fed = {i: [(i * 7 + k) % 97 for k in range(steps[i])] for i in steps}
    joins, rows = {0: 0, 1: 0, 2: 3, 3: 5}, {0: 4, 1: 0, 2: 2, 3: 1}
    engine = BatchDecoder(model, rows=5)
    got: dict[int, list[np.ndarray]] = {i: [] for i in steps}
    done = {i: 0 for i in steps}
    for step in range(16):
        for i in steps:
            if joins[i] == step:
                got[i].append(engine.prefill(rows[i], prompts[i]).numpy().copy())
        live = [i for i in steps if joins[i] <= step and done[i] < steps[i]]
        for i in steps:
            if joins[i] <= step and done[i] == steps[i] and engine.length(rows[i]):
                engine.release(rows[i])
        if live:
            logits = engine.decode([rows[i] for i in live], [fed[i][done[i]] for i in live]).numpy()
            for j, i in enumerate(live):
                got[i].append(logits[j].copy())
                done[i] += 1
    for i in steps:
        cache = model.new_cache(1, len(prompts[i]) + steps[i] + 1)
        with kael.no_grad():
            want = [_prefill(model, prompts[i], cache).numpy().copy()]
            decoder = model.decode_step(cache)  # the one-row step generate runs
            assert decoder is not None
            for t in fed[i]:
                want.append(decoder([0], [t]).numpy()[0].copy())
                cache.lengths[0] += 1
        assert len(got[i]) == len(want) == steps[i] + 1
        for a, b in zip(got[i], want):
            if _reference_backend():
                np.testing.assert_array_equal(a, b)  # one gemv per row: bit for bit
            else:
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_prefill_many_gives_each_prompt_its_logits_alone() -> None:
    model = _random_model(3, dim=64)
    prompts = [[4, 8, 15], [16] * 11, [23], [42, 7] * 9, [1, 2, 3, 4, 5, 6]]
    rows = [5, 0, 3, 1, 4]
    engine = BatchDecoder(model, rows=6)
    got = engine.prefill_many(rows, prompts).numpy().copy()
    assert got.shape == (len(prompts), 97)
    assert [engine.length(r) for r in range(6)] == [11, 18, 0, 1, 6, 3]
    for i, prompt in enumerate(prompts):
        alone = BatchDecoder(model, rows=1)
        want = alone.prefill(0, prompt).numpy().copy()
        np.testing.assert_array_equal(got[i], want)  # the same calls as alone: bit for bit
        with kael.no_grad():  # and, up to rounding, what the one-block-per-row cache's forward pass gives
            contiguous = _prefill(model, prompt, model.new_cache(1, len(prompt) + 1)).numpy()
        np.testing.assert_allclose(got[i], contiguous, rtol=0, atol=1e-5)
        # the cache rows hold what a prefill alone writes: the next step agrees too
        np.testing.assert_array_equal(engine.decode([rows[i]], [9]).numpy(), alone.decode([0], [9]).numpy())


def test_prefill_many_checks_everything_before_it_starts_a_row() -> None:
    model = _random_model(0, ctx=8)
    engine = BatchDecoder(model, rows=3)
    engine.prefill(2, [1])
    cases = [
        (([0, 1], [[1]]), kael.ShapeError, "one prompt per row"),
        (([], []), kael.ShapeError, "one prompt per row"),
        (([0, 0], [[1], [2]]), kael.ShapeError, r"rows \[0, 0\] repeat a row"),
        (([0, 2], [[1], [2]]), kael.KaelError, "row 2 is in use"),
        (([0, 3], [[1], [2]]), kael.ShapeError, "row 3 is out of range"),
        (([0, 1], [[1], [1] * 8]), kael.ShapeError, "leaves no room"),
        (([0, 1], [[1], [97]]), kael.KaelError, "97"),
        ((0, [[1]]), kael.ShapeError, "prefill_many: rows must be a sequence, got int"),
        (([0], None), kael.ShapeError, "prefill_many: prompts must be a sequence, got NoneType"),
    ]
    for (rows, prompts), error, match in cases:
        with pytest.raises(error, match=match):
            engine.prefill_many(rows, prompts)
        assert [engine.length(r) for r in range(3)] == [0, 0, 1]  # nothing started


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_greedy_picks_what_sample_picks_row_by_row(dtype: type) -> None:
    rng = np.random.default_rng(4)
    rows = rng.standard_normal((9, 300)).astype(dtype)
    rows[1, [7, 200]] = 50.0  # a tie: the first one wins
    rows[2, 13] = np.nan  # NaN is the largest (as in PyTorch)
    rows[3] = 1.5  # all equal
    rows[4] = -np.inf
    rows[5, 299] = np.inf
    rows[6, [0, 5]] = np.nan
    logits = kael.tensor(rows)
    want = [BatchDecoder.sample(kael.select(logits, 0, i)) for i in range(9)]
    assert BatchDecoder.greedy(logits) == want
    assert want[1] == 7 and want[3] == 0 and want[5] == 299
    assert BatchDecoder.greedy(kael.narrow(logits, 0, 3, 4)) == want[3:7]  # a view works too
    for bad in (kael.select(logits, 0, 0), kael.tensor(np.zeros((2, 0), np.float32)), kael.tensor([[1, 2]])):
        with pytest.raises(kael.ShapeError, match="BatchDecoder.greedy"):
            BatchDecoder.greedy(bad)


def test_seeded_sampling_does_not_depend_on_the_other_rows() -> None:
    model = _random_model(7)
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6], [5, 3]]
    alone = [
        model.generate(p, 12, temperature=0.9, generator=kael.Generator().manual_seed(s))
        for p, s in zip(prompts, (11, 22, 33))
    ]
    engine = BatchDecoder(model, rows=3)
    got = _run(engine, prompts, 12, joins=[0, 1, 3], rows=[2, 0, 1], seeds=[11, 22, 33], temperature=0.9)
    assert got == alone


def test_rows_are_checked() -> None:
    model = _random_model(0, ctx=8)
    engine = BatchDecoder(model, rows=2)
    with pytest.raises(kael.ShapeError, match="row 2 is out of range"):
        engine.prefill(2, [1])
    with pytest.raises(kael.KaelError, match="row 0 holds no sequence"):
        engine.decode([0], [1])
    with pytest.raises(kael.ShapeError, match="leaves no room"):
        engine.prefill(0, [1] * 8)
    engine.prefill(0, [1] * 7)
    with pytest.raises(kael.KaelError, match="row 0 is in use"):
        engine.prefill(0, [1])
    with pytest.raises(kael.ShapeError, match="out of range for a vocabulary"):
        engine.decode([0], [97])
    with pytest.raises(kael.ShapeError, match="one token per row"):
        engine.decode([0], [1, 2])
    with pytest.raises(kael.ShapeError, match="decode: tokens must be a sequence, got int"):
        engine.decode([0], 1)
    engine.decode([0], [1])
    assert engine.length(0) == 8
    with pytest.raises(kael.ShapeError, match="is full"):
        engine.decode([0], [1])
    engine.release(0)
    assert engine.length(0) == 0
    with pytest.raises(kael.ShapeError, match="rows must be an int"):
        BatchDecoder(model, rows=0)


def test_unpaged_is_one_block_of_the_whole_context_per_row() -> None:
    model = _random_model(0, ctx=8)
    engine = BatchDecoder(model, rows=3, paged=False, block_size=2)  # block_size is ignored without paging
    cache = engine.cache
    assert (engine.block_size, cache.block_size, cache.pool.num_blocks) == (8, 8, 3)
    prompt = [3, 1, 4, 1, 5]
    engine.prefill(2, prompt)
    engine.prefill(0, prompt)  # the same prompt: nothing is shared by prefix without paging
    assert engine.cached_tokens(0) == 0 and len(cache.tables[0]) == len(cache.tables[2]) == 1
    assert cache.tables[0] != cache.tables[2] and engine.free_blocks == 1
    alone = BatchDecoder(model, rows=1)
    want = alone.prefill(0, prompt).numpy().copy()
    got = engine.decode([0, 2], [7, 7]).numpy()
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(alone.decode([0], [7]).numpy()[0], got[0])
    assert want.shape == (97,)


def test_fork_continues_the_prompt_exactly_as_its_own_prefill() -> None:
    model = _random_model(5)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    engine = BatchDecoder(model, rows=3)
    engine.prefill(2, prompt)
    engine.fork(2, 0)
    assert [engine.length(r) for r in range(3)] == [8, 0, 8]
    alone = BatchDecoder(model, rows=1)
    alone.prefill(0, prompt)
    want = alone.decode([0], [7]).numpy().copy()
    got = engine.decode([0, 2], [7, 7]).numpy()
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[0])
    with pytest.raises(kael.KaelError, match="row 1 holds no sequence"):
        engine.fork(1, 1)
    with pytest.raises(kael.KaelError, match="row 0 is in use"):
        engine.fork(2, 0)
    with pytest.raises(kael.ShapeError, match="out of range"):
        engine.fork(2, 3)


def test_generate_with_a_sampler_sees_every_token_so_far() -> None:
    model = _random_model(6)
    seen: list[list[int]] = []

    def pick(logits: kael.Tensor, tokens: list[int]) -> int:
        seen.append(list(tokens))
        assert logits.shape == (97,)
        return int(np.argmax(logits.numpy()))

    got = model.generate([5, 6], 4, sampler=pick)
    assert got == model.generate([5, 6], 4)  # argmax: greedy's tokens
    assert seen == [[5, 6], [5, 6, *got[:1]], [5, 6, *got[:2]], [5, 6, *got[:3]]]
    with pytest.raises(kael.KaelError, match="sampler returned 97"):
        model.generate([5], 2, sampler=lambda logits, tokens: 97)
    with pytest.raises(kael.DTypeError, match="sampler must be callable"):
        model.generate([5], 2, sampler=3)
