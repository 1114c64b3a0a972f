"""kael.engine's request-centric core: Request, Scheduler.schedule(), KVManager, ModelRunner, EngineCore.

Oracle: ``model.generate`` on each prompt alone (greedy, and seeded through the same
``TokenSampler``), the model's own full forward pass for multi-token logits, and the plans
worked out by hand for the token budget. Requests join, are chunked, preempted when the block
pool runs out and resumed as prefills that hit the prefix cache; the outputs never change.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kael.engine import (
    EngineCore,
    KVManager,
    ModelRunner,
    Request,
    RequestError,
    RequestStatus,
    SamplingParams,
    ScheduledRow,
    Scheduler,
    SchedulerOutput,
    TokenSampler,
    check_fits,
)
from kael.models import GPT, BatchDecoder

V, CTX = 97, 64
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def model() -> GPT:
    return GPT(V, CTX, 2, 4, 32, generator=kael.Generator().manual_seed(0))


def _prompts(seed: int, count: int, lo: int = 3, hi: int = 30) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, V, size=int(rng.integers(lo, hi))).tolist() for _ in range(count)]


def _drain(core: EngineCore, limit: int = 2000) -> list[SchedulerOutput]:
    plans = []
    while core.has_unfinished:
        events = core.step()
        assert core.last_plan is not None
        plans.append(core.last_plan)
        for e in events:
            assert e.error is None, e.error
        assert len(plans) < limit, "the engine makes no progress"
    return plans


def test_schedule_chunks_prefill_within_the_budget_then_decodes(model: GPT) -> None:
    kv = KVManager(BatchDecoder(model, rows=4, block_size=4))
    sched = Scheduler(kv, max_num_batched_tokens=8)
    a, b = Request(list(range(1, 21)), GREEDY), Request([5, 6, 7], GREEDY)
    sched.add(a)
    sched.add(b)
    runner = ModelRunner(kv.decoder)

    def step() -> list[tuple[Request, int, int, bool]]:
        plan = sched.schedule()
        assert plan.num_tokens <= 8
        runner.execute(plan)
        for r in plan.rows:
            r.request.num_computed += r.n
            if r.samples:
                r.request.append(0)
        return [(r.request, r.start, r.n, r.decode) for r in plan.rows]

    assert step() == [(a, 0, 8, False)]  # the budget is spent: b waits
    assert step() == [(a, 8, 8, False)]
    assert step() == [(a, 16, 4, False), (b, 0, 3, False)]  # a's last chunk samples; b starts
    assert step() == [(a, 20, 1, True), (b, 3, 1, True)]  # both decode
    assert a.output_ids == b.output_ids == [0, 0]


def test_chunked_and_batched_greedy_equals_alone(model: GPT) -> None:
    prompts = _prompts(0, 6)
    alone = [model.generate(p, 12) for p in prompts]
    for budget in (2048, 7, 1):
        core = EngineCore.on(BatchDecoder(model, rows=4, block_size=4), max_num_batched_tokens=budget)
        reqs = [Request(p, GREEDY) for p in prompts]
        for r in reqs:
            core.add(r)
        plans = _drain(core)
        assert all(p.num_tokens <= budget for p in plans)
        assert [r.output_ids for r in reqs] == alone
        assert all(r.status is RequestStatus.FINISHED_LENGTH for r in reqs)


def _sampled(params: SamplingParams, prompt: list[int], seed: int) -> TokenSampler:
    return TokenSampler(params, prompt, kael.Generator().manual_seed(seed))


def test_preemption_takes_the_newest_and_resumes_from_the_prefix_cache(model: GPT) -> None:
    # 64 tokens of blocks (one context) for 3 rows: long generations must preempt
    prompts = _prompts(1, 3, lo=18, hi=22)
    params = SamplingParams(max_tokens=30, temperature=0.9, top_p=0.95, seed=1)
    alone = []
    for i, p in enumerate(prompts):
        sampler = _sampled(params, p, i)
        alone.append(model.generate(p, 30, sampler=sampler))
    core = EngineCore.on(BatchDecoder(model, rows=3, block_size=4, kv_cache_tokens=CTX))
    reqs = [Request(p, params, sampler=_sampled(params, p, i)) for i, p in enumerate(prompts)]
    for r in reqs:
        core.add(r)
    preempted: list[Request] = []
    resumed_starts: list[int] = []
    while core.has_unfinished:
        running = list(core.scheduler.running)
        core.step()
        plan = core.last_plan
        assert plan is not None
        for victim in plan.preempted:
            assert victim.arrival == max(r.arrival for r in running if r not in preempted or r is victim)
            assert victim.status is RequestStatus.WAITING and victim.num_computed == 0 and victim.row is None
            preempted.append(victim)
        resumed_starts += [r.start for r in plan.rows if r.request.preemptions and r.start and not r.decode]
    assert core.scheduler.preemptions > 0 and preempted
    assert resumed_starts and min(resumed_starts) > 0  # resumed as a prefill after its cached prefix
    assert [r.output_ids for r in reqs] == alone


def test_greedy_with_preemption_equals_the_unpreempted_run(model: GPT) -> None:
    prompts = _prompts(2, 5, lo=10, hi=24)
    params = SamplingParams(max_tokens=28, temperature=0.0)
    alone = [model.generate(p, 28) for p in prompts]
    core = EngineCore.on(BatchDecoder(model, rows=5, block_size=4, kv_cache_tokens=80), max_num_batched_tokens=16)
    reqs = [Request(p, params) for p in prompts]
    for r in reqs:
        core.add(r)
    _drain(core)
    assert core.scheduler.preemptions > 0
    assert [r.output_ids for r in reqs] == alone


def test_a_repeated_prompt_hits_the_prefix_cache(model: GPT) -> None:
    prompt = _prompts(3, 1, lo=40, hi=41)[0]
    core = EngineCore.on(BatchDecoder(model, rows=2, block_size=4))
    first, again = Request(prompt, GREEDY), Request(prompt, GREEDY)
    core.add(first)
    _drain(core)
    core.add(again)
    plans = _drain(core)
    # 9 whole blocks and 3 slots of the 10th copied (NOTE [partial block]): never the last token.
    assert first.num_cached == 0 and again.num_cached == 39
    assert plans[0].rows[0].start == 39 and plans[0].rows[0].n == 1
    assert again.output_ids == first.output_ids == model.generate(prompt, 12)


def test_a_prompt_of_the_same_step_is_no_partial_block_source(model: GPT) -> None:
    # The second request starts in the step that computes the first's prompt: it reuses the
    # first's whole blocks (read after they are written, in plan order) but copies no slots of
    # one whose K/V its pass has yet to write (NOTE [partial block]).
    prompt = _prompts(6, 1, lo=24, hi=25)[0]  # six whole blocks: the last holds the last token
    core = EngineCore.on(BatchDecoder(model, rows=2, block_size=4))
    first, second = Request(prompt, GREEDY), Request(prompt, GREEDY)
    core.add(first)
    core.add(second)
    plans = _drain(core)
    assert [(r.start, r.n) for r in plans[0].rows] == [(0, 24), (20, 4)]
    assert second.num_cached == 20
    assert first.output_ids == second.output_ids == model.generate(prompt, 12)


def test_repeats_of_a_cached_prompt_in_one_step_each_compute_one_token(model: GPT) -> None:
    # A cached one-block prompt, asked again by four requests in one step (8 clients sending the
    # same prompt to the server): the first copies 3 slots from the cached block, whose
    # registration its fresh block adopts (NOTE [twins]); the others copy those 3 written slots
    # from it (NOTE [partial block]). Each computes its last token only, as a request alone does.
    prompt = _prompts(7, 1, lo=4, hi=5)[0]
    core = EngineCore.on(BatchDecoder(model, rows=4, block_size=4))
    first = Request(prompt, GREEDY)
    core.add(first)
    _drain(core)
    repeats = [Request(prompt, GREEDY) for _ in range(4)]
    for r in repeats:
        core.add(r)
    plans = _drain(core)
    assert [(r.start, r.n) for r in plans[0].rows] == [(3, 1)] * 4
    assert [r.num_cached for r in repeats] == [3] * 4
    for r in repeats:
        assert r.output_ids == first.output_ids == model.generate(prompt, 12)
    assert isinstance(core.kv, KVManager)
    core.kv.pool.check()


def test_forked_choices_share_the_prefill_and_equal_alone(model: GPT) -> None:
    prompt = _prompts(4, 1)[0]
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=3, n=3)
    alone = [model.generate(prompt, 10, sampler=_sampled(params, prompt, 3 + j)) for j in range(3)]
    core = EngineCore.on(BatchDecoder(model, rows=3, block_size=4))
    parent = Request(prompt, params, sampler=_sampled(params, prompt, 3))
    kids = [Request(prompt, params, sampler=_sampled(params, prompt, 3 + j), fork_of=parent) for j in (1, 2)]
    for r in [parent, *kids]:
        core.add(r)
    plans = _drain(core)
    assert [r.request for r in plans[0].rows] == [parent]  # one prefill; the others are forks
    assert all(k.num_cached == 0 and k.started for k in kids)
    assert [r.output_ids for r in [parent, *kids]] == alone


def test_multi_token_rows_return_every_positions_logits(model: GPT) -> None:
    ids = _prompts(5, 1, lo=20, hi=21)[0]
    kv = KVManager(BatchDecoder(model, rows=2, block_size=4))
    req = Request(ids, GREEDY)
    assert kv.start(req, 12)
    ModelRunner(kv.decoder).execute(SchedulerOutput([ScheduledRow(req, 0, 0, tuple(ids[:12]), False)]))
    req.num_computed = 12
    assert kv.grow(req, ids[12:])
    plan = SchedulerOutput([ScheduledRow(req, 0, 12, tuple(ids[12:]), False, all_logits=True)])
    got = ModelRunner(kv.decoder).execute(plan).row(0)
    assert got is not None and got.shape == (8, V)
    with kael.no_grad():
        want = model(kael.tensor([ids], dtype=kael.int64)).numpy()[0, 12:]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def test_a_failing_sampler_ends_only_its_request(model: GPT) -> None:
    prompts = _prompts(6, 3)

    def boom(_: Any) -> int:
        raise RuntimeError("sampler broke")

    core = EngineCore.on(BatchDecoder(model, rows=3, block_size=4))
    reqs = [Request(prompts[0], GREEDY), Request(prompts[1], GREEDY, sampler=boom), Request(prompts[2], GREEDY)]
    for r in reqs:
        core.add(r)
    errors = []
    while core.has_unfinished:
        errors += [e for e in core.step() if e.error is not None]
    assert [e.request for e in errors] == [reqs[1]] and "sampler broke" in str(errors[0].error)
    assert reqs[1].status is RequestStatus.FINISHED_ABORTED
    assert [reqs[0].output_ids, reqs[2].output_ids] == [model.generate(prompts[0], 12), model.generate(prompts[2], 12)]
    assert core.kv.free_rows == 3


def test_stop_tokens_end_a_request_with_stop(model: GPT) -> None:
    prompt = _prompts(7, 1)[0]
    full = model.generate(prompt, 12)
    core = EngineCore.on(BatchDecoder(model, rows=1))
    req = Request(prompt, GREEDY, eos_ids=[full[4]])
    core.add(req)
    _drain(core)
    cut = full.index(full[4])
    assert req.output_ids == full[: cut + 1] and req.finish_reason == "stop"


def test_bad_requests_name_the_field(model: GPT) -> None:
    with pytest.raises(RequestError, match="prompt_ids"):
        Request([], GREEDY)
    with pytest.raises(RequestError, match="prompt_ids.*-1"):
        Request([1, -1], GREEDY)
    with pytest.raises(RequestError, match="params"):
        Request([1], {"temperature": 0})  # type: ignore[arg-type]
    with pytest.raises(RequestError, match=r"max_tokens.*\(60\).*64"):
        check_fits([1] * 10, SamplingParams(max_tokens=60), CTX)
    core = EngineCore.on(BatchDecoder(model, rows=1))
    with pytest.raises(RequestError, match=r"max_tokens.*\(60 tokens\) plus max_tokens \(12\).*64"):
        core.add(Request([1] * 60, GREEDY))
    with pytest.raises(RequestError, match=r"prompt_ids.*token id 97 .*vocabulary of 97"):
        core.add(Request([1, 97], GREEDY))
    assert not core.has_unfinished
    with pytest.raises(kael.KaelError, match="max_num_batched_tokens"):
        Scheduler(core.kv, max_num_batched_tokens=0)


@settings(max_examples=12, deadline=None)
@given(
    st.integers(0, 2**16),
    st.integers(1, 6),
    st.sampled_from([1, 3, 16, 2048]),
    st.sampled_from([CTX, 96, 400]),
    st.integers(1, 4),
)
def test_any_budget_pool_and_rows_give_the_alone_outputs(
    model: GPT, seed: int, count: int, budget: int, pool: int, rows: int
) -> None:
    prompts = _prompts(seed, count, lo=1, hi=30)
    alone = [model.generate(p, 10) for p in prompts]
    core = EngineCore.on(
        BatchDecoder(model, rows=rows, block_size=4, kv_cache_tokens=pool), max_num_batched_tokens=budget
    )
    reqs = [Request(p, SamplingParams(max_tokens=10, temperature=0.0)) for p in prompts]
    for r in reqs:
        core.add(r)
    _drain(core)
    assert [r.output_ids for r in reqs] == alone
    assert isinstance(core.kv, KVManager) and core.kv.free_rows == rows
    core.kv.pool.check()


def test_a_failing_prefill_ends_only_its_request(model: GPT, monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = [_prompts(8 + n, 1, lo=n, hi=n + 1)[0] for n in (5, 11, 17)]  # lengths tell them apart
    bad = len(prompts[1])
    run_layer = model.run_layer

    def flaky(i: int, x: Any, step: Any) -> Any:
        if x.shape[1] == bad and i == 1:
            raise RuntimeError("layer broke")
        return run_layer(i, x, step)

    monkeypatch.setattr(model, "run_layer", flaky)
    core = EngineCore.on(BatchDecoder(model, rows=3, block_size=4))
    reqs = [Request(p, GREEDY) for p in prompts]
    for r in reqs:
        core.add(r)
    errors = []
    while core.has_unfinished:
        errors += [e for e in core.step() if e.error is not None]
    monkeypatch.undo()
    assert [e.request for e in errors] == [reqs[1]] and "layer broke" in str(errors[0].error)
    assert [reqs[0].output_ids, reqs[2].output_ids] == [model.generate(prompts[0], 12), model.generate(prompts[2], 12)]
    assert isinstance(core.kv, KVManager) and core.kv.free_rows == 3
    core.kv.pool.check()


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**16), st.integers(1, 3), st.sampled_from([2, 5, 2048]), st.sampled_from([CTX, 80, 400]))
def test_forked_seeded_choices_survive_preemption_and_chunking(
    model: GPT, seed: int, count: int, budget: int, pool: int
) -> None:
    # every prompt with n=2 seeded choices (a nucleus sampler each): the same tokens as alone
    prompts = _prompts(seed, count, lo=2, hi=24)
    params = SamplingParams(max_tokens=14, temperature=0.8, top_p=0.9, seed=seed, n=2)
    alone = [model.generate(p, 14, sampler=_sampled(params, p, seed + j)) for p in prompts for j in range(2)]
    core = EngineCore.on(BatchDecoder(model, rows=4, block_size=4, kv_cache_tokens=pool), max_num_batched_tokens=budget)
    reqs: list[Request] = []
    for p in prompts:
        first = Request(p, params, sampler=_sampled(params, p, seed))
        reqs += [first, Request(p, params, sampler=_sampled(params, p, seed + 1), fork_of=first)]
    for r in reqs:
        core.add(r)
    _drain(core)
    assert [r.output_ids for r in reqs] == alone
    assert isinstance(core.kv, KVManager) and core.kv.free_rows == 4
    core.kv.pool.check()


def test_a_ban_processor_from_outside_survives_forks_and_preemption_in_the_engine(model: GPT) -> None:
    from test_logits_processors import BanToken  # the processor written outside the engine

    prompts = _prompts(9, 2, lo=14, hi=20)
    params = SamplingParams(max_tokens=24, temperature=1.0, n=2)

    def alone(prompt: list[int], seed: int, ban: int) -> list[int]:
        sampler = TokenSampler(params, prompt, kael.Generator().manual_seed(seed), processors=[BanToken(ban)])
        return model.generate(prompt, 24, sampler=sampler)

    # each prompt bans the token its unbanned first choice picks most: the ban must change something
    free = [model.generate(p, 24, sampler=_sampled(params, p, 40 + 2 * i)) for i, p in enumerate(prompts)]
    bans = [max(set(f), key=f.count) for f in free]
    core = EngineCore.on(BatchDecoder(model, rows=4, block_size=4, kv_cache_tokens=CTX), max_num_batched_tokens=8)
    reqs: list[Request] = []
    for i, p in enumerate(prompts):  # a batch of 4: two prompts, n=2 each
        root = TokenSampler(params, p, kael.Generator().manual_seed(40 + 2 * i), processors=[BanToken(bans[i])])
        first = Request(p, params, sampler=root)
        twin = root.fork(kael.Generator().manual_seed(41 + 2 * i))  # its processors' state forks too
        reqs += [first, Request(p, params, sampler=twin, fork_of=first)]
    for r in reqs:
        core.add(r)
    _drain(core)
    assert core.scheduler.preemptions > 0
    for j, r in enumerate(reqs):
        i = j // 2
        assert bans[i] not in r.output_ids  # its own ban, every step, per row
        assert r.output_ids == alone(prompts[i], 40 + j, bans[i])  # forked and preempted = alone
        assert isinstance(r.sampler, TokenSampler)
        ban = r.sampler.processors[-1]
        assert isinstance(ban, BanToken) and ban.seen == r.output_ids
