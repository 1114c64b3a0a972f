"""What tests/core/test_gemma2.py and test_gemma3.py share beyond family_parity.py: ``LONG``, a prompt five to ten
windows long (so each sliding layer's mask matters), and the checks both Gemma families pass over it against
transformers' model of the same random checkpoint (logits, chunked prefill with the KV cache, greedy generate)
or against the kael model's own forward pass (query chunks, the generic decode step on float32 and Q8_0
weights), and the reading of a released checkpoint's config.json beside transformers' reading of it.

Each check takes what differs between the families: the kael class, and whether a check goes further.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import family_parity as fp
import kael
import numpy as np
import pytest
from kael.models import from_pretrained
from kael.models.llama import LlamaDecodeStep

__all__ = [
    "LONG",
    "check_chunked_prefill",
    "check_generic_decode_step",
    "check_greedy_generate",
    "check_logits",
    "check_q8_0_decode_step",
    "check_query_chunks",
    "read_released_config",
]

#: A prompt of 40 tokens: five to ten windows long.
LONG = [(13 * i + 7) % 200 for i in range(40)]
#: The prefill chunks of ``LONG`` through the KV cache (several tokens after cached ones, one alone, the rest).
CHUNKS = ((0, 3), (3, 10), (10, 11), (11, 40))


def _chunked(model: Any, bounds: tuple[tuple[int, int], ...]) -> np.ndarray:
    """The logits of ``LONG`` prefilled through one KV cache in the chunks ``bounds``, concatenated."""
    cache = model.new_cache()
    with kael.no_grad():
        parts = [model(kael.tensor([LONG[a:b]]), cache).numpy()[0] for a, b in bounds]
    return np.concatenate(parts)


def check_logits(pair: fp.Pair) -> None:
    """family_parity's prompts and ``LONG`` give transformers' logits."""
    fp.check_logits(pair)
    _, hf, model = pair
    np.testing.assert_allclose(fp.logits(model, LONG), fp.hf_logits(hf, [LONG])[0], atol=1e-4, rtol=0)


def check_query_chunks(pair: fp.Pair, monkeypatch: pytest.MonkeyPatch, with_cache: bool) -> None:
    """NOTE [gemma query chunks]: chunks of 3 and 7 queries, each over the keys it sees, give the unchunked
    logits (whole prompts, and with ``with_cache`` chunked prefill with a cache too)."""
    from kael.models.gemma3 import _attention

    _, _, model = pair
    want = fp.logits(model, LONG)
    for size in (3, 7):
        monkeypatch.setattr(_attention, "QUERY_CHUNK", size)
        np.testing.assert_allclose(fp.logits(model, LONG), want, atol=1e-5, rtol=0)
        if with_cache:
            np.testing.assert_allclose(_chunked(model, ((0, 11), (11, 40))), want, atol=1e-5, rtol=0)


def check_chunked_prefill(pair: fp.Pair) -> None:
    """Chunks of several tokens after cached ones: queries mid-sequence see exactly their window."""
    _, hf, model = pair
    np.testing.assert_allclose(_chunked(model, CHUNKS), fp.hf_logits(hf, [LONG])[0], atol=1e-4, rtol=0)


def check_greedy_generate(pair: fp.Pair) -> None:
    """32 greedy tokens with the KV cache, from prompts shorter and longer than the window."""
    _, hf, model = pair
    for ids in (fp.PROMPTS[0], fp.PROMPTS[1], LONG[:17]):
        assert model.generate(ids, 32) == fp.hf_greedy(hf, ids, 32)


def check_generic_decode_step(pair: fp.Pair, backend: str, kael_class: type[Any]) -> None:
    """No direct step (decode_step is None): GenericStep runs the forward pieces and equals the full pass."""
    _, _, model = pair
    assert model.decode_step(model.new_cache()) is None
    fp.check_decode_step(pair, backend, False, kael_class, LlamaDecodeStep)


def check_q8_0_decode_step(pair: fp.Pair) -> None:
    """weights="q8_0" (llama.cpp's plan over the family's GGUF tensors): the generic step equals the forward
    pass."""
    d, _, _ = pair
    model = from_pretrained(d, weights="q8_0")
    assert model.weights_scheme == "q8_0"
    ids = LONG[:20]
    rows = fp._step_rows(model, ids, 6, False, LlamaDecodeStep, None)
    np.testing.assert_allclose(rows, fp.logits(model, ids)[6:], atol=2e-5, rtol=0)


def read_released_config(tmp_path: Path, fields: dict[str, Any], read_config: Any) -> tuple[Any, Any]:
    """A config.json of ``fields`` in ``tmp_path`` as the family's ``read_config`` and transformers'
    ``AutoConfig`` read it."""
    import transformers

    (tmp_path / "config.json").write_text(json.dumps(fields))
    return read_config(tmp_path), transformers.AutoConfig.from_pretrained(tmp_path)
