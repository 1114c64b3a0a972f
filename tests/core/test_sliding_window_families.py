"""Sliding-window layers of the Llama-derived families (``LlamaConfig.layer_windows``, kael/models/llama/_windows.py):
Mistral's ``sliding_window`` on every layer, qwen2's ``use_sliding_window`` from ``max_window_layers`` on, qwen3's
``layer_types`` and SmolLM3's default (its no-rope layers slide), each with a window shorter than the prompts.

Oracles: transformers' model of the same random checkpoint (logits on both CPU backends, a right-padded batch, the
KV cache fed token by token, greedy generate, the config.json kael writes read back), and the kael model's own
forward pass or each row alone (the direct decode step with the paged_attention kernel's window, the generic step,
the batched decoder, the prefix cache with blocks of 8 positions, longer than no window here).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import family_parity as fp
import kael
import llama_checkpoints
import numpy as np
import phi3_checkpoints
import pytest
import qwen3_checkpoints
import qwen3_moe_checkpoints
import smollm3_checkpoints
from kael.models import from_pretrained
from kael.models.llama import LlamaDecodeStep

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SLIDING, FULL = "sliding_attention", "full_attention"
SHAPES: dict[str, dict[str, Any]] = {
    "mistral-w5": {"family": "mistral", "sliding_window": 5},
    "qwen2-w4-from-layer1": {
        "family": "qwen2",
        "use_sliding_window": True,
        "sliding_window": 4,
        "max_window_layers": 1,
    },
    "qwen3-layer-types-w6": {
        "family": "qwen3",
        "use_sliding_window": True,
        "sliding_window": 6,
        "layer_types": [SLIDING, FULL],
        "head_dim": 16,
    },
    "smollm3-default-w3": {"family": "smollm3", "use_sliding_window": True, "sliding_window": 3, "layer_types": None},
    "phi3-w5": {"family": "phi3", "sliding_window": 5},  # Phi-3-mini-4k's sliding_window on every layer
    "qwen3moe-w4": {
        "family": "qwen3_moe",
        "use_sliding_window": True,
        "sliding_window": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
    },
}
WINDOWS = {"mistral-w5": (5, 5), "qwen2-w4-from-layer1": (0, 4), "qwen3-layer-types-w6": (6, 0), "phi3-w5": (5, 5)}
ARCHITECTURES = {
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}


def build(directory: Path, *, family: str, seed: int = 0, save_dtype: Any = None, **overrides: Any) -> Any:
    """A random transformers checkpoint of ``family`` with ``overrides`` (its window) saved to ``directory``."""
    if family in ("mistral", "qwen2"):
        return llama_checkpoints.build(directory, family, seed=seed, save_dtype=save_dtype, **overrides)
    module = {
        "qwen3": qwen3_checkpoints,
        "smollm3": smollm3_checkpoints,
        "phi3": phi3_checkpoints,
        "qwen3_moe": qwen3_moe_checkpoints,
    }[family]
    return module.build(directory, seed=seed, save_dtype=save_dtype, **overrides)


@pytest.fixture(scope="module", params=list(SHAPES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> fp.Pair:
    d = tmp_path_factory.mktemp(request.param)
    hf = build(d, seed=1, **SHAPES[request.param])
    model = from_pretrained(d)
    model.shape_name = request.param
    return d, hf, model


def test_the_windows_are_read_as_transformers_applies_them(pair: fp.Pair) -> None:
    d, hf, model = pair
    got = tuple(blk.self_attn.window or 0 for blk in model.model.layers)
    if model.shape_name in WINDOWS:
        assert got == WINDOWS[model.shape_name]
    w = hf.config.sliding_window
    assert got == tuple(w if t == SLIDING else 0 for t in getattr(hf.config, "layer_types", None) or [SLIDING] * 2)
    assert model.config.layer_windows == got
    # a window that matters: the logits move when transformers attends to the whole context instead
    base = fp.hf_logits(hf, [fp.PROMPTS[0]])[0]
    hf.config.sliding_window = None
    if hasattr(hf.config, "layer_types"):
        hf.config.layer_types = [FULL] * len(got)
    try:
        assert fp.logits_moved(hf, base) > 1e-2
    finally:
        hf.config.sliding_window = w
        if hasattr(hf.config, "layer_types"):
            hf.config.layer_types = [SLIDING if x else FULL for x in got]


def test_logits_match_transformers(pair: fp.Pair, backend: str) -> None:
    fp.check_logits(pair)


def test_right_padded_batch_matches_transformers(pair: fp.Pair) -> None:
    fp.check_right_padded_batch(pair)


def test_incremental_cache_equals_transformers(pair: fp.Pair) -> None:
    fp.check_incremental_cache(pair)


def test_greedy_generate_matches_transformers(pair: fp.Pair) -> None:
    _, hf, model = pair
    for ids in fp.PROMPTS[:2]:
        want = fp.hf_greedy(hf, ids, 32)  # up to the config's eos, where transformers stops
        got = model.generate(ids, 32)
        eos = hf.generation_config.eos_token_id
        assert got[: len(want)] == want and (len(want) == 32 or want[-1] in (eos if isinstance(eos, list) else [eos]))


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "generic"])
def test_decode_step_equals_the_full_pass(pair: fp.Pair, backend: str, direct: bool) -> None:
    # SmolLM3's shape sums to 2.0e-5 of its full pass without a window already, 2.3e-5 with one (the prefill's
    # packed products of 24 rows): the direct and the generic step give the same rows
    _, _, model = pair
    ids = [(7 * i + 3) % 200 for i in range(24)]
    rows = fp._step_rows(model, ids, 8, direct, LlamaDecodeStep, None)
    np.testing.assert_allclose(rows, fp.logits(model, ids)[8:], atol=4e-5, rtol=0)


def test_batched_rows_equal_each_alone(pair: fp.Pair) -> None:
    fp.check_batched_rows(pair)


def test_tokens_at_positions_equal_one_step_at_a_time(pair: fp.Pair) -> None:
    fp.check_decode_entries(pair)


def test_prefix_cache_hits_equal_cold_prefills(pair: fp.Pair) -> None:
    fp.check_prefix_cache(pair)


def test_save_pretrained_round_trip(pair: fp.Pair, tmp_path: Path) -> None:
    d, hf, model = pair
    family = json.loads((d / "config.json").read_text())["model_type"]
    fp.check_save_pretrained(tmp_path, pair, family, ARCHITECTURES[family])
    assert from_pretrained(tmp_path).config.layer_windows == model.config.layer_windows


def test_save_gguf_refuses_windows_it_cannot_record(pair: fp.Pair, tmp_path: Path) -> None:
    """GGUF's phi3 architecture records a sliding window (attention.sliding_window); the others have no field."""
    model = pair[2]
    if model.shape_name.startswith("phi3"):
        kael.models.save_gguf(model, tmp_path / "m.gguf")
        back = kael.models.load_gguf(tmp_path / "m.gguf")[0]
        assert back.config.layer_windows == model.config.layer_windows
        np.testing.assert_array_equal(fp.logits(back, fp.PROMPTS[0]), fp.logits(model, fp.PROMPTS[0]))
        return
    with pytest.raises(kael.KaelError, match="sliding-window layers|qwen3moe"):  # kael writes no qwen3moe file
        kael.models.save_gguf(model, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


def test_layer_windows_checks() -> None:
    cfg = dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=2)
    assert kael.models.LlamaConfig(**cfg, layer_windows=(3, 0)).layer_windows == (3, 0)
    for bad in ((3,), (3, -1), (True, 0)):
        with pytest.raises(kael.ShapeError, match="layer_windows"):
            kael.models.LlamaConfig(**cfg, layer_windows=bad)
    model = kael.models.LlamaForCausalLM(kael.models.LlamaConfig(**cfg, model_type="mistral", layer_windows=(3, 3)))
    ids = [[1, 2, 3, 4, 5, 6, 7]]
    with kael.no_grad():
        windowed = model(kael.tensor(ids)).numpy()
        for blk in model.model.layers:
            blk.self_attn.window = None
        full = model(kael.tensor(ids)).numpy()
    np.testing.assert_array_equal(windowed[:, :3], full[:, :3])  # the first 3 positions see the same keys
    assert np.abs(windowed[:, 3:] - full[:, 3:]).max() > 1e-4
