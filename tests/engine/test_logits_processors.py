"""The logits-processor seam from outside the engine: a processor that bans a token id, on a
batch of 4 rows (2 prompts, n=2), applies per row and survives fork, preemption and rollback."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import kael
import numpy as np
import pytest
from kael.engine import LogitsProcessor, SamplingParams, TokenSampler, sample_rows
from kael.models import GPT, BatchDecoder

V = 41
STEPS = 14
PARAMS = SamplingParams(temperature=1.0)


class BanToken:
    """Bans one token id; keeps (as a grammar would) the tokens it was told of, and checks them."""

    def __init__(self, banned: int) -> None:
        self.banned = banned
        self.seen: list[int] = []
        self.calls = 0

    def apply(self, logits: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
        assert list(tokens) == self.seen  # its state is in step with the sequence
        self.calls += 1
        out = logits.copy()
        out[self.banned] = -np.inf
        return out

    def accept(self, token: int) -> None:
        self.seen.append(token)

    def fork(self) -> BanToken:
        twin = BanToken(self.banned)
        twin.seen = list(self.seen)
        return twin

    def rollback(self, n_tokens: int) -> None:
        del self.seen[len(self.seen) - n_tokens :]


def _model() -> GPT:
    return GPT(V, 64, 2, 2, 16, generator=kael.Generator().manual_seed(21))


def _alone(model: GPT, prompt: list[int], seed: int, ban: int | None) -> list[int]:
    processors = [BanToken(ban)] if ban is not None else []
    sampler = TokenSampler(PARAMS, prompt, kael.Generator().manual_seed(seed), processors=processors)
    return model.generate(prompt, STEPS, sampler=sampler)


def test_a_ban_from_outside_applies_per_row_and_survives_fork_and_preemption() -> None:
    model = _model()
    prompts = [[1, 2, 3, 4, 5], [7, 8]]
    # each prompt bans the token its unbanned choices pick most: the ban must change something
    bans = [
        Counter(_alone(model, p, s, None) + _alone(model, p, s + 1, None)).most_common(1)[0][0]
        for p, s in zip(prompts, (100, 200))
    ]
    assert isinstance(BanToken(0), LogitsProcessor)

    engine = BatchDecoder(model, 4, 64, block_size=4)
    samplers: list[TokenSampler] = []
    first = []
    for p, (prompt, seed) in enumerate(zip(prompts, (100, 200))):
        root = TokenSampler(PARAMS, prompt, kael.Generator().manual_seed(seed), processors=[BanToken(bans[p])])
        samplers += [root, root.fork(kael.Generator().manual_seed(seed + 1))]  # n=2: choice i seeded seed + i
        first.append(np.asarray(engine.prefill(2 * p, prompt)))
        engine.fork(2 * p, 2 * p + 1)
    logits = np.stack([first[0], first[0], first[1], first[1]])
    live = [0, 1, 2, 3]
    tokens = sample_rows(logits, samplers)
    for step in range(1, STEPS):
        if step == 5:  # row 3 loses its blocks; its request (sampler, processors) waits untouched
            engine.preempt(3)
            live = [0, 1, 2]
        out = np.asarray(engine.decode(live, [tokens[r] for r in live]))
        rows = {r: out[i] for i, r in enumerate(live)}
        if step == 8:  # resumed as an ordinary prefill of its prompt and tokens (the prefix cache hits)
            rows[3] = np.asarray(engine.prefill(3, prompts[1] + samplers[3].output))
            live = [0, 1, 2, 3]
        step_rows = sorted(rows)
        got = sample_rows(np.stack([rows[r] for r in step_rows]), [samplers[r] for r in step_rows])
        for r, t in zip(step_rows, got):
            tokens[r] = t
    outputs = [s.output for s in samplers]
    assert [len(o) for o in outputs] == [STEPS, STEPS, STEPS, STEPS - 3]
    for r, seq in enumerate(outputs):
        p = r // 2
        assert bans[p] not in seq  # its own ban, every step
        want = _alone(model, prompts[p], (100, 200)[p] + r % 2, bans[p])
        assert seq == want[: len(seq)]  # batched, forked and preempted = alone
        assert samplers[r].processors[-1].seen == seq  # type: ignore[attr-defined]
    assert samplers[0].processors[-1] is not samplers[1].processors[-1]
    assert samplers[0].processors[-1].calls == STEPS  # type: ignore[attr-defined]
    for p, seed in enumerate((100, 200)):  # the ban changed what each prompt's first choice says
        assert _alone(model, prompts[p], seed, bans[p]) != _alone(model, prompts[p], seed, None)
    for p, seed in enumerate((100, 200)):  # the ban changed what each prompt's first choice says
        assert _alone(model, prompts[p], seed, bans[p]) != _alone(model, prompts[p], seed, None)


def test_rollback_forgets_rejected_tokens_in_the_sampler_and_its_processors() -> None:
    ban = BanToken(3)
    sampler = TokenSampler(SamplingParams(temperature=0, frequency_penalty=1.0), processors=[ban])
    x = np.array([0.0, 5.0, 4.9, 9.0, 1.0])
    assert [sampler(x) for _ in range(3)] == [1, 2, 1]  # 3 banned; the penalty alternates 1 and 2
    sampler.rollback(2)
    assert sampler.output == ban.seen == [1]
    assert sampler(x) == 2  # as if the rejected tokens never came
    assert sampler.output == ban.seen == [1, 2]
    with pytest.raises(kael.KaelError, match="rollback"):
        sampler.rollback(3)
    with pytest.raises(kael.DTypeError, match="LogitsProcessor"):
        TokenSampler(PARAMS, processors=[object()])  # type: ignore[list-item]
