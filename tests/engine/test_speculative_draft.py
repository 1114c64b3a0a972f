"""Speculative decoding with a draft model (kael.engine.DraftModelProposer): outputs identical to
plain decoding.

Oracle: the same engine without a speculator (and ``model.generate`` for greedy rows), on a random
GPT-2 and a random Llama as targets; drafts from the target itself (every draft accepted: the
acceptance rate shows the drafting is in step with the ids) and from a different, smaller random
model (few accepted: the rejection paths), greedy and seeded, alone and 4 rows batched, with a
draft cache small enough that rows restart; bad drafts (another vocabulary) are refused.
"""

from __future__ import annotations

from typing import Any

import kael
import pytest
from kael import KaelError
from kael.engine import DraftModelProposer, Request, Speculator
from kael.models import GPT, LlamaConfig, LlamaForCausalLM
from test_speculative import CTX, GREEDY, SEEDED, V, _prompts, _Recorder, _run


def _llama(seed: int, hidden: int = 32, layers: int = 2) -> Any:
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CTX,
    )
    return LlamaForCausalLM(cfg, generator=kael.Generator().manual_seed(seed), initializer_range=0.1)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def target(request: pytest.FixtureRequest) -> Any:
    if request.param == "gpt2":
        return GPT(V, CTX, 2, 4, 32, generator=kael.Generator().manual_seed(0))
    return _llama(1)


@pytest.fixture(scope="module")
def small() -> Any:
    """Another model over the same vocabulary: its drafts are mostly wrong."""
    return _llama(7, hidden=16, layers=1)


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("which", ["self", "small"])
def test_greedy_outputs_are_those_of_plain_decoding(target: Any, small: Any, rows: int, which: str) -> None:
    prompts = _prompts(21, rows)
    draft = target if which == "self" else small
    spec = Speculator(DraftModelProposer(draft, k=4, rows=rows, target=target))
    got, _ = _run(target, prompts, lambda p, i: Request(p, GREEDY), rows=rows, speculator=spec)
    plain = [target.generate(p, 24) for p in prompts]
    assert [r.output_ids for r in got] == plain
    assert spec.proposed > 0
    if which == "self":  # the target drafting for itself: every draft is what it then samples greedily
        assert spec.acceptance_rate == 1.0
    else:
        assert spec.acceptance_rate < 1.0


@pytest.mark.parametrize("rows", [1, 4])
def test_seeded_outputs_and_logprobs_are_those_of_plain_decoding(target: Any, small: Any, rows: int) -> None:
    prompts = _prompts(22, rows)
    outs = []
    for speculator in (Speculator(DraftModelProposer(small, k=3, rows=rows)), None):
        recorders = [_Recorder(SEEDED, p, i) for i, p in enumerate(prompts)]
        reqs, _ = _run(
            target,
            prompts,
            lambda p, i, rec=recorders: Request(p, SEEDED, sampler=rec[i]),
            rows=rows,
            speculator=speculator,
        )
        outs.append(([r.output_ids for r in reqs], [rec.logprobs for rec in recorders]))
    assert outs[0] == outs[1]


def test_rows_restart_when_a_rejection_reaches_into_a_full_block(target: Any, small: Any) -> None:
    """Block size 2 in the draft's cache: most rollbacks cut into a full block, so the row starts
    again from the ids (its full blocks from the draft's prefix cache); outputs stay plain ones."""
    prompts = _prompts(23, 3)
    proposer = DraftModelProposer(small, k=5, rows=2)  # fewer draft rows than requests
    proposer.decoder = kael.models.BatchDecoder(small, rows=2, block_size=2)
    spec = Speculator(proposer)
    got, _ = _run(target, prompts, lambda p, i: Request(p, GREEDY), rows=3, speculator=spec)
    assert [r.output_ids for r in got] == [target.generate(p, 24) for p in prompts]
    assert spec.proposed > 0
    assert not proposer._rows  # every finished request gave its draft row back


def test_a_row_far_behind_is_started_again_by_one_prefill(target: Any) -> None:
    """A request that moved on by more than REFILL_AFTER ids since its last drafts (as after a pause of
    speculation) has its draft row started again by one prefill, not a decode step per id; the drafts are
    still the draft's greedy continuation (the target drafting for itself: ``generate``'s tokens)."""
    from kael.engine.draft_proposer import REFILL_AFTER

    prompt = _prompts(25, 1)[0]
    want = target.generate(prompt, 30)
    proposer = DraftModelProposer(target, k=4, rows=1)
    req = Request(prompt, GREEDY)
    assert proposer.propose(req, 4) == want[:4]
    calls = {"prefill": 0, "decode": 0}
    for name in calls:
        method = getattr(proposer.decoder, name)

        def counted(*args: Any, _name: str = name, _method: Any = method) -> Any:
            calls[_name] += 1
            return _method(*args)

        setattr(proposer.decoder, name, counted)
    req.output_ids.extend(want[:2])  # near: the ids it lacks are fed one decode step each
    assert proposer.propose(req, 4) == want[2:6]
    assert calls == {"prefill": 0, "decode": 1 + 3}  # want[1] (want[0] was fed while drafting), then 3 drafts
    req.output_ids.extend(want[2 : 2 + REFILL_AFTER + 10])  # far behind: one prefill
    calls.update(prefill=0, decode=0)
    assert proposer.propose(req, 4) == want[REFILL_AFTER + 12 : REFILL_AFTER + 16]
    assert calls == {"prefill": 1, "decode": 3}


def test_a_draft_with_another_vocabulary_or_bad_settings_is_refused(target: Any) -> None:
    other = GPT(V + 3, CTX, 1, 2, 16, generator=kael.Generator().manual_seed(3))
    with pytest.raises(KaelError, match=r"draft model's vocabulary \(100 tokens\) differs from the target's \(97\)"):
        DraftModelProposer(other, target=target)
    with pytest.raises(KaelError, match="k must be an int >= 1, got 0"):
        DraftModelProposer(target, k=0)
    with pytest.raises(KaelError, match="rows must be an int >= 1, got 0"):
        DraftModelProposer(target, rows=0)
