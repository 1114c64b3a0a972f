"""kael.engine.Request without a sampler: only params the runner's own draw honours (request.py).

The runner draws a sampler-less request from temperature and top_k alone, so a request whose
params say more (a grammar constraint, penalties, logit_bias, min_tokens, top_p, min_p,
logprobs) is refused with a RequestError naming ``sampler``, never decoded without them; the
same params with a TokenSampler are taken.
"""

from __future__ import annotations

from typing import Any

import pytest
from kael.engine import Request, RequestError, SamplingParams, TokenSampler

pytest.importorskip("llguidance")


@pytest.mark.parametrize(
    "extra",
    [
        {"repetition_penalty": 1.3},
        {"presence_penalty": 0.5},
        {"logit_bias": {3: -100.0}},
        {"min_tokens": 2},
        {"top_p": 0.9},
        {"min_p": 0.1},
        {"logprobs": 2},
    ],
)
def test_params_a_plain_draw_ignores_need_a_sampler(extra: dict[str, Any]) -> None:
    params = SamplingParams(temperature=0.7, top_k=5, max_tokens=4, **extra)
    with pytest.raises(RequestError, match="sampler: these params") as info:
        Request([1, 2, 3], params, eos_ids=(0,))
    assert info.value.field == "sampler"
    taken = Request([1, 2, 3], params, eos_ids=(0,), sampler=TokenSampler(params, [1, 2, 3]).pick_row)
    assert taken.sampler is not None


def test_a_constraint_without_a_sampler_is_refused() -> None:
    from kael.constraints import json_object

    params = SamplingParams(temperature=0.0, max_tokens=4, constraint=json_object())
    with pytest.raises(RequestError, match="would decode unconstrained"):
        Request([1, 2, 3], params)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, top_k=40)])
def test_temperature_and_top_k_alone_need_none(params: SamplingParams) -> None:
    assert Request([5, 6], params).sampler is None
