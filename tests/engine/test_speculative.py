"""Speculative decoding (kael.engine.proposers, speculative.py): outputs identical to plain decoding.

Oracle: the same engine without a speculator (and ``model.generate`` alone for greedy rows),
on a random GPT-2 and a random Llama, greedy and seeded (a nucleus ``TokenSampler`` with
logprobs), alone and 4 rows batched; a brute-force search for the n-gram lookup; the block
pool's own invariant check after every step, and the prefix index holding only blocks whose
tokens are a request's real (verified) ids.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kael import KaelError
from kael.engine import (
    EngineCore,
    KVManager,
    ModelRunner,
    NgramProposer,
    Request,
    RequestStatus,
    SamplingParams,
    Speculator,
    TokenSampler,
    ngram_lookup,
)
from kael.models import GPT, BatchDecoder
from kael.models._kv_blocks import BlockPool
from tiny_causal_lms import CTX, V, tiny_causal_lm


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def model(request: pytest.FixtureRequest) -> Any:
    return tiny_causal_lm(request.param)


def _prompts(seed: int, count: int) -> list[list[int]]:
    """Copy-heavy prompts: a random phrase repeated (with a change), then a random tail."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        phrase = rng.integers(0, V, size=int(rng.integers(4, 9))).tolist()
        changed = list(phrase)
        changed[int(rng.integers(0, len(phrase)))] = int(rng.integers(0, V))
        out.append(phrase + changed + phrase + rng.integers(0, V, size=int(rng.integers(1, 4))).tolist())
    return out


class _Recorder:
    """A TokenSampler whose every pick's logprob is recorded (plain and speculative alike)."""

    def __init__(self, params: SamplingParams, prompt: list[int], seed: int) -> None:
        self.sampler = TokenSampler(params, prompt, kael.Generator().manual_seed(seed))
        self.logprobs: list[float] = []

    def __call__(self, row: Any) -> int:
        token = self.sampler(row)
        assert self.sampler.last is not None
        self.logprobs.append(self.sampler.last.logprob)
        return token


def _check_pool(core: EngineCore, reqs: list[Request]) -> None:
    """The pool's invariants hold, every running row holds exactly its computed positions, and
    every registered block's tokens are real ids of some request (never a rejected draft)."""
    pool = core.kv.pool  # type: ignore[attr-defined]
    pool.check()
    for r in core.scheduler.running:
        assert pool.length(r.row) == r.num_computed or r.prefilling
    bs = pool.block_size
    for block in pool._index.values():
        own = list(pool._btokens[block])
        assert any(own == r.all_ids[i : i + bs] for r in reqs for i in range(0, len(r.all_ids) - bs + 1, bs)), (
            f"block {block} holds {own}, no request's ids"
        )


def _run(
    model: Any,
    prompts: list[list[int]],
    make: Callable[[list[int], int], Request],
    *,
    rows: int,
    speculator: Speculator | None,
    kv_tokens: int | None = None,
    block_size: int = 16,
    direct: bool | None = None,
) -> tuple[list[Request], EngineCore]:
    decoder = BatchDecoder(model, rows=rows, block_size=block_size, kv_cache_tokens=kv_tokens, direct=direct)
    core = EngineCore.on(decoder, speculator=speculator)
    reqs = [make(p, i) for i, p in enumerate(prompts)]
    for r in reqs:
        core.add(r)
    steps = 0
    while core.has_unfinished:
        for e in core.step():
            assert e.error is None, e.error
        _check_pool(core, reqs)
        steps += 1
        assert steps < 2000, "the engine makes no progress"
    return reqs, core


GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
SEEDED = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.95, seed=5, logprobs=2)


# direct None: drafts verify inside the decode step (NOTE [drafts in the decode step]); False: the generic
# step takes no positions, so they verify through model.run_layer
@pytest.mark.parametrize("direct", [None, False])
@pytest.mark.parametrize("rows", [1, 4])
def test_greedy_outputs_are_those_of_plain_decoding(model: Any, rows: int, direct: bool | None) -> None:
    prompts = _prompts(11, rows)
    spec = Speculator(NgramProposer(n_max=3, k=4))
    got, core = _run(model, prompts, lambda p, i: Request(p, GREEDY), rows=rows, speculator=spec, direct=direct)
    assert isinstance(core.runner, ModelRunner) and core.runner.decoder.takes_entries is (direct is None)
    plain, _ = _run(model, prompts, lambda p, i: Request(p, GREEDY), rows=rows, speculator=None)
    assert [r.output_ids for r in got] == [r.output_ids for r in plain] == [model.generate(p, 24) for p in prompts]
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in got)
    assert spec.verifications > 0


@pytest.mark.parametrize("direct", [None, False])
@pytest.mark.parametrize("rows", [1, 4])
def test_seeded_outputs_and_logprobs_are_those_of_plain_decoding(model: Any, rows: int, direct: bool | None) -> None:
    prompts = _prompts(12, rows)
    spec = Speculator(NgramProposer())

    def make(p: list[int], i: int) -> Request:
        return Request(p, SEEDED, sampler=_Recorder(SEEDED, p, 100 + i))

    got, _ = _run(model, prompts, make, rows=rows, speculator=spec, direct=direct)
    plain, _ = _run(model, prompts, make, rows=rows, speculator=None, direct=direct)
    assert [r.output_ids for r in got] == [r.output_ids for r in plain]
    for a, b in zip(got, plain):
        assert isinstance(a.sampler, _Recorder) and isinstance(b.sampler, _Recorder)
        assert len(a.sampler.logprobs) == len(b.sampler.logprobs) == len(a.output_ids)
        # inside the decode step every entry has its one-step bits; run_layer over k+1 positions is within 1e-6
        np.testing.assert_allclose(a.sampler.logprobs, b.sampler.logprobs, rtol=0, atol=0 if direct is None else 1e-6)
    assert spec.verifications > 0


def test_copy_heavy_prompt_accepts_drafts_and_takes_fewer_steps(model: Any) -> None:
    phrase = [3, 14, 15, 92, 65, 35, 89, 79]
    prompt = phrase * 6
    spec = Speculator(NgramProposer(k=6))
    got, core = _run(model, [prompt], lambda p, i: Request(p, GREEDY), rows=1, speculator=spec)
    assert got[0].output_ids == model.generate(prompt, 24)
    assert spec.accepted > 0 and 0 < spec.acceptance_rate <= 1
    assert spec.proposed == spec.accepted + spec.rejected


@pytest.mark.parametrize("cut", [1, 4, 9, 15])
def test_eos_and_max_tokens_inside_an_accepted_run_end_where_plain_decoding_does(model: Any, cut: int) -> None:
    prompts = _prompts(13, 4)
    plain, _ = _run(model, prompts, lambda p, i: Request(p, GREEDY), rows=4, speculator=None)
    eos = [r.output_ids[cut] for r in plain]  # an end token that plain decoding emits mid-way
    short = SamplingParams(max_tokens=cut + 1, temperature=0.0)

    def with_eos(p: list[int], i: int) -> Request:
        return Request(p, GREEDY, eos_ids=[eos[i]])

    def with_length(p: list[int], i: int) -> Request:
        return Request(p, short)

    for make in (with_eos, with_length):
        spec = Speculator(NgramProposer(k=6))
        got, _ = _run(model, prompts, make, rows=4, speculator=spec)
        ref, _ = _run(model, prompts, make, rows=4, speculator=None)
        assert [r.output_ids for r in got] == [r.output_ids for r in ref]
        assert [r.finish_reason for r in got] == [r.finish_reason for r in ref]


def test_on_token_stop_inside_an_accepted_run(model: Any) -> None:
    # a server's stop (a stop string, a cancellation) says "no more" after the third token
    prompts = _prompts(14, 2)

    def make(p: list[int], i: int) -> Request:
        seen: list[int] = []

        def on_token(t: int) -> bool:
            seen.append(t)
            return len(seen) < 3

        return Request(p, GREEDY, on_token=on_token)

    got, _ = _run(model, prompts, make, rows=2, speculator=Speculator(NgramProposer()))
    assert [r.output_ids for r in got] == [model.generate(p, 3) for p in prompts]
    assert all(r.status is RequestStatus.FINISHED_ABORTED for r in got)


def test_preemption_with_speculation_keeps_the_outputs(model: Any) -> None:
    prompts = _prompts(15, 3)
    params = SamplingParams(max_tokens=30, temperature=0.9, top_p=0.95, seed=1)

    def make(p: list[int], i: int) -> Request:
        return Request(p, params, sampler=TokenSampler(params, p, kael.Generator().manual_seed(i)))

    spec = Speculator(NgramProposer())
    got, core = _run(model, prompts, make, rows=3, speculator=spec, kv_tokens=CTX, block_size=4)
    ref, _ = _run(model, prompts, make, rows=1, speculator=None)
    assert core.scheduler.preemptions > 0
    assert [r.output_ids for r in got] == [r.output_ids for r in ref]


# -- the parts -------------------------------------------------------------------------------------


def _brute(ids: list[int], n_max: int, n_min: int, k: int) -> list[int]:
    for n in range(n_max, n_min - 1, -1):
        if len(ids) < n + 1:
            continue
        tail = ids[len(ids) - n :]
        for i in range(len(ids) - n - 1, -1, -1):
            if ids[i : i + n] == tail:
                seq = list(ids)
                while len(seq) < len(ids) + k:  # read on through the proposal itself
                    seq.append(seq[i + n + len(seq) - len(ids)])
                return seq[len(ids) :]
    return []


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=40),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(0, 6),
)
def test_ngram_lookup_is_the_most_recent_longest_match(ids: list[int], a: int, b: int, k: int) -> None:
    n_min, n_max = min(a, b), max(a, b)
    assert ngram_lookup(ids, n_max, n_min, k) == (_brute(ids, n_max, n_min, k) if k else [])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=20),
    st.lists(st.lists(st.integers(0, 4), min_size=0, max_size=6), min_size=1, max_size=8),
    st.integers(0, 7),
)
def test_ngram_proposer_keeps_each_requests_ids_up_to_date(
    prompt: list[int], steps: list[list[int]], edit: int
) -> None:
    """NgramProposer converts only the ids appended since its last lookup; each proposal equals the brute-force
    lookup on the request's ids as they are then, also after the output was replaced by another one (a
    rebuilt request), and a released request starts afresh."""
    proposer = NgramProposer(n_max=3, n_min=1, k=4)
    req = Request(prompt)
    for i, added in enumerate(steps):
        if i == edit and req.output_ids:
            req.output_ids[-1] = (req.output_ids[-1] + 1) % 5  # not a continuation of what was converted
        req.output_ids.extend(added)
        assert proposer.propose(req, 4) == _brute(req.all_ids, 3, 1, 4)
    if len(req.output_ids) > 2:
        del req.output_ids[-2:]  # shorter than what was converted
        assert proposer.propose(req, 2) == _brute(req.all_ids, 3, 1, 2)
    proposer.release(req)
    assert req not in proposer._ids and proposer.propose(req, 3) == _brute(req.all_ids, 3, 1, 3)


def test_ngram_proposer_refuses_bad_settings() -> None:
    with pytest.raises(KaelError, match="n_min"):
        NgramProposer(n_min=0)
    with pytest.raises(KaelError, match="n_max"):
        NgramProposer(n_max=1, n_min=2)
    with pytest.raises(KaelError, match="k must be"):
        NgramProposer(k=0)
    with pytest.raises(KaelError, match="k_max"):
        Speculator(NgramProposer(), k_max=16)
    with pytest.raises(KaelError, match="proposer"):
        Speculator(object())  # type: ignore[arg-type]


class _Fixed:
    """Proposes the same ids every time."""

    k = 4

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.calls = 0

    def propose(self, request: Request, k: int) -> list[int]:
        self.calls += 1
        return self.ids[:k]

    def release(self, request: Request) -> None:
        pass


def test_adaptive_k_shrinks_pauses_and_retries() -> None:
    spec = Speculator(_Fixed([1, 2, 3, 4]), off_after=2, cooldown=3, max_cooldown=6, warmup=0)
    spec.probing = False  # no step timings here: NOTE [adaptive k] alone
    req = Request([1, 2, 3])
    assert spec.drafts(req, 10) == [1, 2, 3, 4]
    spec.record(req, 4, 1)  # a rejection after one accepted: k = 2
    assert spec.drafts(req, 10) == [1, 2]
    spec.record(req, 2, 0)
    assert spec.drafts(req, 10) == [1]
    spec.record(req, 1, 0)  # the second zero in a row: paused for 3 steps
    assert [spec.drafts(req, 10) for _ in range(3)] == [[], [], []]
    assert spec.drafts(req, 10) == [1, 2, 3, 4]  # retried at full k
    spec.record(req, 4, 0)
    spec.record(req, 1, 0)
    assert [spec.drafts(req, 10) for _ in range(6)] == [[]] * 6  # the pause doubled
    assert spec.drafts(req, 2) == [1, 2]  # never more than the room
    spec.record(req, 2, 2)  # a success: the pause goes back to 3, k stays at its most
    assert spec.state(req).k == 4 and spec.state(req).cooldown == 3
    spec.record(req, 4, 0)  # k = accepted + 1
    assert spec.drafts(req, 10) == [1]
    spec.record(req, 1, 1)  # all accepted: k doubles
    assert spec.drafts(req, 10) == [1, 2]
    spec.record(req, 2, 2)
    assert spec.drafts(req, 10) == [1, 2, 3, 4]  # (at most k_max)
    spec.probing = True  # a probe drafts one; its rejection leaves k alone
    assert spec.drafts(req, 10) == [1]
    spec.record(req, 1, 0)
    assert spec.state(req).k == 4
    spec.probing = False
    assert (spec.proposed, spec.accepted, spec.rejected) == (22, 6, 16)
    spec.forget(req)
    assert spec.drafts(req, 10) == [1, 2, 3, 4]


def test_wrong_drafts_cost_nothing_but_steps(model: Any) -> None:
    prompts = _prompts(16, 2)
    bad = _Fixed([V - 1, V - 2, V - 3, V - 4])
    spec = Speculator(bad, off_after=2, cooldown=4)
    got, _ = _run(model, prompts, lambda p, i: Request(p, GREEDY), rows=2, speculator=spec)
    assert [r.output_ids for r in got] == [model.generate(p, 24) for p in prompts]
    assert spec.verifications < 2 * 24  # paused after two misses in a row, not tried at every step


def test_block_pool_truncate_drops_only_the_unfilled_tail() -> None:
    pool = BlockPool(8, 4)
    pool.allocate("a", list(range(6)))  # one full block, two positions of the next
    for t in (6, 7, 8):  # 7 fills block 1 (registered); 8 starts block 2
        pool.append("a", t)
    with pytest.raises(KaelError, match="length must be an int in 8..9"):
        pool.truncate("a", 7)  # would cut into a full, registered block
    free = pool.free_blocks
    pool.truncate("a", 8)  # block 2 held only position 8: it goes back free
    assert pool.length("a") == 8 and len(pool.block_table("a")) == 2 and pool.free_blocks == free + 1
    pool.check()
    pool.append("a", 9)
    pool.append("a", 10)
    pool.truncate("a", 9)
    assert pool.length("a") == 9 and len(pool.block_table("a")) == 3
    pool.check()


def test_forked_choices_with_speculation(model: Any) -> None:
    # n = 2 seeded choices per prompt (forks of one prefill), each speculating on its own
    prompts = _prompts(17, 2)
    params = SamplingParams(max_tokens=20, temperature=0.7, seed=2, n=2)

    def sampler(p: list[int], seed: int) -> TokenSampler:
        return TokenSampler(params, p, kael.Generator().manual_seed(seed))

    def build(spec: Speculator | None) -> list[Request]:
        core = EngineCore.on(BatchDecoder(model, rows=4, block_size=16), speculator=spec)
        reqs = []
        for i, p in enumerate(prompts):
            first = Request(p, params, sampler=sampler(p, 10 * i))
            reqs += [first, Request(p, params, sampler=sampler(p, 10 * i + 1), fork_of=first)]
        for r in reqs:
            core.add(r)
        while core.has_unfinished:
            assert all(e.error is None for e in core.step())
            _check_pool(core, reqs)
        return reqs

    spec = Speculator(NgramProposer())
    got, ref = build(spec), build(None)
    assert [r.output_ids for r in got] == [r.output_ids for r in ref]
    assert [r.num_cached for r in got] == [r.num_cached for r in ref]  # the siblings were forked alike
    assert spec.verifications > 0


@pytest.fixture(scope="module")
def gpt() -> GPT:
    return GPT(V, CTX, 2, 4, 32, generator=kael.Generator().manual_seed(3))


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    count=st.integers(1, 4),
    budget=st.integers(1, 40),
    block_size=st.sampled_from([2, 3, 4, 8, 16]),
    pool=st.integers(1, 3),
    k=st.integers(1, 8),
    seeded=st.booleans(),
)
def test_any_budget_pool_and_block_size_gives_the_plain_outputs(
    gpt: GPT, seed: int, count: int, budget: int, block_size: int, pool: int, k: int, seeded: bool
) -> None:
    # chunked prefill, drafts cut by the budget and the block room, preemption when the pool is small
    prompts = _prompts(seed, count)
    rng = np.random.default_rng(seed)
    temperature = 0.9 if seeded else 0.0
    params = [SamplingParams(max_tokens=int(rng.integers(1, 20)), temperature=temperature) for _ in prompts]
    tokens = pool * CTX

    def run(spec: Speculator | None) -> list[list[int]]:
        decoder = BatchDecoder(gpt, rows=count, block_size=block_size, kv_cache_tokens=tokens)
        core = EngineCore(
            KVManager(decoder),
            ModelRunner(decoder),
            max_num_batched_tokens=budget,
            vocab_size=V,
            speculator=spec,
        )
        reqs = [
            Request(p, q, generator=kael.Generator().manual_seed(seed + i) if seeded else None)
            for i, (p, q) in enumerate(zip(prompts, params))
        ]
        for r in reqs:
            core.add(r)
        for _ in range(3000):
            if not core.has_unfinished:
                break
            assert all(e.error is None for e in core.step())
            _check_pool(core, reqs)
        assert not core.has_unfinished
        return [r.output_ids for r in reqs]

    assert run(Speculator(NgramProposer(k=k), k_max=k)) == run(None)


def test_speculation_pauses_when_it_costs_more_per_token_and_probes_again() -> None:
    """NOTE [speculation pays or pauses]: synthetic step costs, seconds per token."""
    spec = Speculator(_Fixed([1, 2]), warmup=2, probe_after=4, max_probe_after=8, slack=0.05)
    req = Request([1, 2, 3])
    assert spec.drafts(req, 10) == []  # the warm-up steps are plain: the baseline
    spec.observe_step(1.0, 1, speculated=False)
    spec.observe_step(1.0, 1, speculated=False)
    assert spec.probing and spec.drafts(req, 10) == [1]  # the first try is a probe: one draft
    spec.record(req, 1, 1)  # accepted, and yet
    spec.observe_step(3.0, 2, speculated=True)  # 1.5 s a token against 1.0: a loss
    assert spec.pauses == 1 and spec.paused_steps == 4 and spec.probing
    for _ in range(4):
        assert spec.drafts(req, 10) == []
        spec.observe_step(1.0, 1, speculated=False)
    assert spec.drafts(req, 10) == [1]  # probing again: one draft
    spec.record(req, 1, 1)
    spec.observe_step(3.0, 2, speculated=True)
    assert spec.paused_steps == 8  # it lost again: twice as long (at most max_probe_after)
    for _ in range(8):
        spec.observe_step(1.0, 1, speculated=False)
    assert spec.drafts(req, 10) == [1]
    spec.observe_step(1.5, 3, speculated=True)  # 0.5 s a token: it pays, it goes on with every draft
    assert spec.paused_steps == 0 and not spec.probing and spec.drafts(req, 10) == [1, 2]
    spec.observe_step(1.0, 3, speculated=True)
    assert spec.pauses == 2
    with pytest.raises(KaelError, match=r"slack must be a number in \[0, 1\), got 2"):
        Speculator(_Fixed([1]), slack=2)


def test_a_probe_whose_drafts_were_all_wrong_pauses_for_the_shorter_idle_pause() -> None:
    """A losing probe with no accepted draft (nothing to copy yet) pauses for ``idle_pause`` steps, doubling
    while it keeps failing, or (r - 1) / slack steps where it cost r times a plain step's tokens; one whose drafts were accepted and still cost more pauses for ``probe_after``; a probe
    that pays sets both back."""
    spec = Speculator(_Fixed([1, 2]), warmup=1, probe_after=32, idle_pause=8, max_probe_after=256)
    spec.observe_step(1.0, 1, speculated=False)

    def probe(accepted: int, seconds: float) -> int:
        while spec.paused_steps:
            spec.observe_step(1.0, 1, speculated=False)
        req = Request([1, 2, 3])  # (a new request each time: NOTE [adaptive k]'s own pause is not tested here)
        assert spec.probing and spec.drafts(req, 10) == [1]
        spec.record(req, 1, accepted)
        spec.observe_step(seconds, 1 + accepted, speculated=True)
        return spec.paused_steps

    assert [probe(0, 1.1) for _ in range(3)] == [8, 16, 32]  # 1.1x a plain step: (1.1 - 1) / 0.03 < 8
    assert probe(1, 3.0) == 32  # accepted, and dearer per token: the cost pause
    assert probe(0, 1.1) == 64
    assert probe(1, 1.0) == 0 and not spec.probing  # 0.5 s a token: it pays
    spec.paused_steps, spec.probing = 0, True
    assert probe(0, 1.1) == 8  # back to the first idle pause
    assert probe(0, 1.6) == 20  # a dear probe (a draft model's): (1.6 - 1) / 0.03 steps, its loss 3% of them
    with pytest.raises(KaelError, match="idle_pause"):
        Speculator(_Fixed([1]), idle_pause=0)


def test_a_step_with_drafts_is_set_against_plain_steps_of_as_many_rows() -> None:
    """NOTE [speculation pays or pauses]: a step's fixed cost is shared by its rows, so plain steps of 8 rows cost
    less per token than plain steps of 3; a step with drafts of 3 rows is judged against the 3-row baseline (here
    it pays, against the 8-row one it would lose), and a row count never seen plain against the nearest one."""
    spec = Speculator(_Fixed([1, 2]), warmup=2, probe_after=4, slack=0.05)
    spec.observe_step(8.0, 8, speculated=False, rows=8)  # 1.0 s a token
    spec.observe_step(6.0, 3, speculated=False, rows=3)  # 2.0 s a token
    spec.observe_step(9.0, 5, speculated=True, rows=3)  # the probe: 1.8 s a token, 0.9 of the 3-row baseline
    assert spec.pauses == 0 and not spec.probing
    for _ in range(3):
        spec.observe_step(7.2, 4, speculated=True, rows=2)  # 1.8 s a token, nearest is 3 rows: pays
    assert spec.pauses == 0
    for _ in range(2):
        spec.observe_step(9.0, 8, speculated=True, rows=7)  # 1.125 s a token, nearest is 8 rows: a loss
    assert spec.pauses == 1 and spec.probing


def test_one_slow_step_does_not_pause_speculation_two_of_three_do() -> None:
    """The median of the last three steps with drafts decides once speculation pays: one slow step (a
    collection, another thread's burst) is not a loss; a second within three is. A probe is judged alone."""
    spec = Speculator(_Fixed([1, 2]), warmup=1, probe_after=4, slack=0.05)
    spec.observe_step(1.0, 1, speculated=False, rows=1)
    spec.observe_step(1.0, 2, speculated=True, rows=1)  # the probe pays: 0.5 s a token
    assert not spec.probing
    spec.observe_step(1.0, 3, speculated=True, rows=1)
    spec.observe_step(30.0, 3, speculated=True, rows=1)  # 10 s a token, once
    spec.observe_step(1.0, 3, speculated=True, rows=1)
    assert spec.pauses == 0 and spec.drafts(Request([1, 2, 3]), 10) == [1, 2]
    spec.observe_step(30.0, 3, speculated=True, rows=1)  # a second slow step within three: a loss
    assert spec.pauses == 1 and spec.paused_steps == 4 and spec.probing
