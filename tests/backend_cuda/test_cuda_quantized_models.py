"""Quantized and half-precision models on the cuda device (host emulation here; the same test on a GPU):
``from_pretrained(device="cuda", weights=...)`` of the bundled GPT-2 and Llama models.

Oracles: the same model on the CPU reference backend (the NumPy definition of every kernel), the
model's generic decode step, and each row decoded alone (NOTE [batched = alone]).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

kael = pytest.importorskip("kael")
server = pytest.importorskip("kael_server.loading")

MODELS = ("kael-tiny", "kael-tiny-chat")


def _logits(model: Any, ids: list[int], device: str) -> np.ndarray:
    with kael.no_grad():
        out: np.ndarray = model(kael.tensor([ids], device=device)).to(device="cpu").numpy()[0].copy()
    return out


@pytest.mark.parametrize("scheme", ["q8_0", "q4_0", "bf16", "f16"])
@pytest.mark.parametrize("name", MODELS)
def test_cuda_logits_equal_the_reference_backend(emulate: Any, name: str, scheme: str) -> None:
    d = server.bundled_model_dir(name)
    ids = [5, 9, 33, 70, 12, 100, 7, 64]
    cuda = kael.models.from_pretrained(d, device="cuda", weights=scheme)
    assert cuda.weights_scheme == scheme and cuda.device.type == "cuda"
    kael.backends.use("cpu", "reference")
    try:
        want = _logits(kael.models.from_pretrained(d, weights=scheme), ids, "cpu")
    finally:
        kael.backends.use("cpu", None)
    got = _logits(cuda, ids, "cuda")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("name", MODELS)
def test_cuda_direct_step_and_batched_rows(emulate: Any, name: str) -> None:
    from kael.models import BatchDecoder, decode_step
    from kael.models._generate import _prefill

    model = kael.models.from_pretrained(server.bundled_model_dir(name), device="cuda", weights="q4_0")
    step = decode_step(model, model.new_cache(1, 8))
    assert type(step).__name__ == ("GPT2DecodeStep" if name == "kael-tiny" else "LlamaDecodeStep")
    prompts = [[1, 2, 3], [5] * 7, [9, 4, 8]]
    feeds = [[10, 11, 12, 13], [20, 21], [30, 31, 32]]
    engine = BatchDecoder(model, rows=3)
    got = [[engine.prefill(r, p).to(device="cpu").numpy().copy()] for r, p in enumerate(prompts)]
    for k in range(4):
        live = [r for r in range(3) if k < len(feeds[r])]
        logits = engine.decode(live, [feeds[r][k] for r in live]).to(device="cpu").numpy()
        for j, r in enumerate(live):
            got[r].append(logits[j].copy())
    for r, p in enumerate(prompts):
        for direct in (None, False):
            cache = model.new_cache(1, 16)
            with kael.no_grad():
                want = [_prefill(model, p, cache).to(device="cpu").numpy().copy()]
                one = decode_step(model, cache, direct)
                for t in feeds[r]:
                    want.append(one([0], [t]).to(device="cpu").numpy()[0].copy())
                    cache.lengths[0] += 1
            for a, b in zip(got[r], want):
                if direct is None:  # the same step alone: bit for bit
                    np.testing.assert_array_equal(a.reshape(-1), b.reshape(-1))
                else:  # the generic step over the model's modules
                    np.testing.assert_allclose(a.reshape(-1), b.reshape(-1), rtol=0, atol=2e-5)
