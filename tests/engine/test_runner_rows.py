"""ModelRunner's one-token rows (NOTE [one pass per plan] in kael/engine/runner.py).

A prompt's last token after its cached prefix (NOTE [partial block] in kael/models/_kv_blocks.py)
joins the step's decode product. Oracles: the logits ``model.run_layer`` gives that one token
(the runner's path for longer rows), bit for bit, for each family, in float32 and Q8_0; and
``model.generate`` alone for the tokens of requests that start while others decode.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
from kael.engine import EngineCore, KVManager, ModelRunner, Request, SamplingParams, ScheduledRow, SchedulerOutput
from kael.models import BatchDecoder
from tiny_causal_lms import tiny_causal_lm

GREEDY = SamplingParams(max_tokens=6, temperature=0.0)


@pytest.fixture(scope="module", params=["gpt2", "llama", "gpt2-q8_0", "llama-q8_0"])
def model(request: pytest.FixtureRequest) -> Any:
    family, _, scheme = request.param.partition("-")
    m = tiny_causal_lm(family)
    return kael.quant.quantize(m, scheme) if scheme else m


def _tail_logits(model: Any, prompt: list[int], one_token_rows_decode: bool) -> np.ndarray:
    """The last token's logits after the rest of ``prompt`` is in the cache, through the runner
    with that row marked a decode step or not."""
    decoder = BatchDecoder(model, rows=2, block_size=4, prefix_caching=False)
    kv, runner = KVManager(decoder), ModelRunner(decoder)
    req = Request(prompt, SamplingParams(max_tokens=2, temperature=0.0))
    assert kv.start(req, len(prompt) - 1)
    runner.execute(SchedulerOutput([ScheduledRow(req, req.row, 0, tuple(prompt[:-1]), False)]))
    req.num_computed = len(prompt) - 1
    assert kv.grow(req, [prompt[-1]])
    row = ScheduledRow(req, req.row, len(prompt) - 1, (prompt[-1],), one_token_rows_decode)
    out = runner.execute(SchedulerOutput([row]))
    assert out.decode_rows == 1  # one token: the decode product, however the row is marked
    return np.asarray(out.row(0).numpy()).copy()


def _run_layer_logits(model: Any, prompt: list[int]) -> np.ndarray:
    """The same token's logits through ``model.run_layer`` (the runner's path for longer rows)."""
    decoder = BatchDecoder(model, rows=1, block_size=4, prefix_caching=False)
    cache = decoder.cache
    with kael.no_grad():
        cache.start(0, prompt)
        for ids, pos in ((prompt[:-1], 0), (prompt[-1:], len(prompt) - 1)):
            step = cache.step([0], len(ids))
            x = model.embed(kael.tensor([ids], dtype=kael.int64), step.starts)
            for layer in range(model.num_layers):
                x = model.run_layer(layer, x, step)
            step.commit()
            assert cache.lengths[0] == pos + len(ids)
        return np.asarray(model.run_head(kael.narrow(x, 1, len(ids) - 1, 1)).numpy()).reshape(-1).copy()


@pytest.mark.parametrize("length", [2, 7, 13])
def test_a_prompts_last_token_in_the_decode_product_equals_run_layer(model: Any, length: int) -> None:
    prompt = np.random.default_rng(length).integers(0, model.vocab_size, length).tolist()
    want = _run_layer_logits(model, prompt)
    for marked in (False, True):
        got = _tail_logits(model, prompt, marked)
        assert got.dtype == want.dtype and np.array_equal(got, want), np.abs(got - want).max()


def test_a_repeated_prompt_joins_the_decoding_rows_in_one_product(model: Any) -> None:
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, model.vocab_size, n).tolist() for n in (9, 14)]
    core = EngineCore.on(BatchDecoder(model, rows=3, block_size=4))
    first = Request(prompts[1], GREEDY)
    core.add(first)
    while core.has_unfinished:  # its prompt and answer fill blocks 0..4 and are cached
        core.step()
    running = Request(prompts[0], GREEDY)
    core.add(running)
    core.step()  # its prefill (9 rows: not a one-token row)
    again = Request(prompts[1], GREEDY)
    core.add(again)
    core.step()
    plan, logits = core.last_plan, core.last_logits
    assert plan is not None and logits is not None
    assert [(r.request, r.n, r.decode) for r in plan.rows] == [(running, 1, True), (again, 1, False)]
    assert again.num_cached == len(prompts[1]) - 1 and logits.decode_rows == 2
    while core.has_unfinished:
        core.step()
    assert again.output_ids == first.output_ids == model.generate(prompts[1], GREEDY.max_tokens)
    assert running.output_ids == model.generate(prompts[0], GREEDY.max_tokens)
