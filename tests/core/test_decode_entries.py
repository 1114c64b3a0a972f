"""BatchDecoder.decode_entries (kael/models/_batched.py) and NOTE [entries at positions] (kael/models/_steps.py):
several tokens of a row in one pass of the family's direct step.

Oracle: the same tokens fed by ``decode`` one step at a time (bit for bit), on GPT-2 and a GQA Llama with random
weights, in float32 and with Q8_0 weights; every other family runs the same check in its own test module
(``family_parity.check_decode_entries``).
"""

from __future__ import annotations

from typing import Any

import family_parity as fp
import kael
import numpy as np
import pytest
from kael.models import BatchDecoder
from tiny_causal_lms import CTX, V, tiny_causal_lm


@pytest.fixture(params=["gpt2", "llama"], scope="module")
def model(request: pytest.FixtureRequest) -> Any:
    return tiny_causal_lm(request.param)


@pytest.mark.parametrize("weights", [None, "q8_0"])
def test_entries_equal_one_step_at_a_time(model: Any, weights: str | None) -> None:
    m = model if weights is None else kael.quantize(model, weights)
    fp.check_decode_entries((None, None, m), vocab=V)


def _decoder(model: Any, **kw: Any) -> BatchDecoder:
    dec = BatchDecoder(model, rows=2, **kw)
    dec.prefill_many([0, 1], [[1, 2, 3], [4, 5]])
    return dec


def test_a_row_past_its_entries_truncates_and_decodes_on_as_alone(model: Any) -> None:
    one, many = _decoder(model), _decoder(model)
    many.allow_drafts(4)
    many.decode_entries([1, 1, 1, 1], [7, 8, 9, 10], [2, 3, 4, 5])
    many.cache.truncate(1, 4)  # the last two rejected
    for t in (7, 8):
        one.decode([1], [t])
    assert many.length(1) == one.length(1) == 4
    assert np.array_equal(many.decode([0, 1], [11, 12]).numpy(), one.decode([0, 1], [11, 12]).numpy())


def test_bad_entries_are_refused_naming_the_rule(model: Any) -> None:
    dec = _decoder(model)
    with pytest.raises(kael.ShapeError, match="consecutive positions from its length 3; expected 3, got 4"):
        dec.decode_entries([0], [1], [4])
    with pytest.raises(kael.ShapeError, match="expected 4, got 5"):
        dec.decode_entries([0, 0], [1, 2], [3, 5])
    with pytest.raises(kael.ShapeError, match="2 rows but 1 positions"):
        dec.decode_entries([0, 1], [1, 2], [3])
    with pytest.raises(kael.ShapeError, match="3 entries, but the step takes 2 .allow_drafts raises it."):
        dec.decode_entries([0, 0, 0], [1, 2, 3], [3, 4, 5])
    with pytest.raises(kael.ShapeError, match="out of range for a vocabulary"):
        dec.decode_entries([0], [V], [3])
    with pytest.raises(kael.ShapeError, match="drafts must be an int >= 0"):
        dec.allow_drafts(-1)
    assert dec.length(0) == 3 and dec.length(1) == 2  # nothing moved
    full = BatchDecoder(model, rows=1)
    full.prefill(0, [1] * (CTX - 1))
    full.allow_drafts(2)
    with pytest.raises(kael.ShapeError, match=f"row 0 is full \\({CTX} positions\\)"):
        full.decode_entries([0, 0], [1, 2], [CTX - 1, CTX])


def test_the_generic_step_takes_no_entries(model: Any) -> None:
    dec = _decoder(model, direct=False)
    assert dec.takes_entries is False and dec.allow_drafts(3) is False
    with pytest.raises(kael.KaelError, match="GenericStep takes one token per row"):
        dec.decode_entries([0], [1], [3])
