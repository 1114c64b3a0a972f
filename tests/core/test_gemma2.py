"""The Gemma 2 family (kael/models/gemma2/ over kael/models/gemma3/): Hugging Face gemma2 checkpoints that
transformers' ``Gemma2ForCausalLM`` writes offline with random weights load through ``kael.models.from_pretrained``
and compute transformers' logits (attention soft-capping on every layer, sliding windows of 4 to 8 positions,
shorter than the prompts, final logit soft-capping), generate its greedy tokens, and decode the same through the
generic step, the KV cache, the batched decoder and the paged cache with prefix caching.

Oracles: transformers' ``Gemma2ForCausalLM`` on the same weights (logits, greedy generate), the model's own
full forward pass (the decode step, cache), each row alone (batched decoding, prefix cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_parity as fp
import gemma_parity as gp
import kael
import numpy as np
import pytest
from gemma2_checkpoints import SHAPES, build
from kael.models.gemma2 import Gemma2Config, Gemma2ForCausalLM, read_config

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pair = fp.pair_fixture(SHAPES, build, Gemma2ForCausalLM)
LONG = gp.LONG


def test_registered_with_a_description() -> None:
    fp.check_registered("gemma2", "Gemma 2", "soft-capping", "sliding-window")


def test_config_and_parameter_names(pair: fp.Pair) -> None:
    d, hf, model = pair
    cfg = read_config(d)
    assert isinstance(cfg, Gemma2Config) and not cfg.qk_norm and cfg.model_type == "gemma2"
    assert cfg.layer_types == tuple(hf.config.layer_types) and cfg.sliding_window == hf.config.sliding_window
    assert cfg.rope_theta == cfg.sliding_rope_theta == hf.config.rope_parameters["rope_theta"]
    assert cfg.scale == hf.config.query_pre_attn_scalar**-0.5
    assert cfg.attn_logit_softcapping == hf.config.attn_logit_softcapping
    assert cfg.final_logit_softcapping == hf.config.final_logit_softcapping
    fp.check_parameter_names(cfg, hf, model)


def test_logits_match_transformers(pair: fp.Pair, backend: str) -> None:
    gp.check_logits(pair)


def test_the_soft_caps_and_the_window_matter(pair: fp.Pair) -> None:
    """Without the attention cap (or the window) the logits move: each is live."""
    d, _, model = pair
    base = fp.logits(model, LONG)
    for attr in ("softcap", "window"):
        other = Gemma2ForCausalLM.from_pretrained(d)
        for layer in other.model.layers:
            setattr(layer.self_attn, attr, None)
        if attr == "window" and all(not model.config.sliding(i) for i in range(model.num_layers)):
            continue
        assert float(np.abs(fp.logits(other, LONG) - base).max()) > 1e-3, attr


def test_query_chunks_give_the_same_logits(pair: fp.Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [gemma query chunks]: chunks of 3 and 7 queries (soft-capped full layers too) give the same logits."""
    gp.check_query_chunks(pair, monkeypatch, with_cache=False)


def test_right_padded_batch_matches_transformers(pair: fp.Pair) -> None:
    fp.check_right_padded_batch(pair)


def test_incremental_cache_equals_the_full_pass(pair: fp.Pair) -> None:
    fp.check_incremental_cache(pair)


def test_chunked_prefill_equals_the_full_pass(pair: fp.Pair) -> None:
    gp.check_chunked_prefill(pair)


def test_greedy_generate_matches_transformers(pair: fp.Pair) -> None:
    gp.check_greedy_generate(pair)


def test_decode_step_is_the_generic_one(pair: fp.Pair, backend: str) -> None:
    gp.check_generic_decode_step(pair, backend, Gemma2ForCausalLM)


def test_batched_rows_equal_each_alone(pair: fp.Pair, backend: str) -> None:
    fp.check_batched_rows(pair)


def test_tokens_at_positions_equal_one_step_at_a_time(pair: fp.Pair) -> None:
    fp.check_decode_entries(pair)


def test_prefix_cache_hits_give_each_row_its_tokens_alone(pair: fp.Pair) -> None:
    fp.check_prefix_cache(pair, hit_tokens=32)


@pytest.mark.usefixtures("float_activations")  # a float oracle (tests/conftest.py)
def test_q8_0_weights_decode_as_their_forward_pass(pair: fp.Pair) -> None:
    gp.check_q8_0_decode_step(pair)


@pytest.mark.parametrize("save_dtype", ["bfloat16", "float16"])
def test_half_checkpoints_load_to_the_same_float32_values(tmp_path: Path, save_dtype: str) -> None:
    fp.check_half_checkpoint(tmp_path, save_dtype, build, SHAPES["gqa"])


def test_save_pretrained_is_read_by_transformers(tmp_path: Path, pair: fp.Pair) -> None:
    def check(config: dict[str, Any], hf: Any) -> None:
        assert config["layer_types"] == hf.config.layer_types
        assert config["attn_logit_softcapping"] == hf.config.attn_logit_softcapping

    fp.check_save_pretrained(tmp_path, pair, "gemma2", "Gemma2ForCausalLM", check)


def _config(tmp_path: Path, **changes: Any) -> Path:
    return fp.write_config(tmp_path, build, SHAPES["gqa"], **changes)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"hidden_activation": "gelu"}, "hidden_activation"),
        ({"attn_logit_softcapping": 0}, "attn_logit_softcapping"),
        ({"final_logit_softcapping": "30"}, "final_logit_softcapping"),
        ({"sliding_window": None}, "sliding_window"),
        ({"layer_types": ["sliding_attention"]}, "layer_types"),
        ({"query_pre_attn_scalar": -1}, "query_pre_attn_scalar"),
        ({"rope_parameters": {"rope_type": "su"}}, "rope type"),
        ({"head_dim": 15}, "head_dim"),
    ],
)  # fmt: skip
def test_configs_gemma2_cannot_run_are_refused_naming_the_field(
    tmp_path: Path, changes: dict[str, Any], match: str
) -> None:
    fp.check_refused(_config(tmp_path, **changes), match, "Gemma2 config")


def test_null_layer_types_alternate_and_caps_default() -> None:
    cfg = Gemma2Config(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                       num_attention_heads=2, head_dim=8, max_position_embeddings=16, sliding_window=4)  # fmt: skip
    assert [cfg.sliding(i) for i in range(4)] == [True, False, True, False]
    assert (cfg.attn_logit_softcapping, cfg.final_logit_softcapping) == (50.0, 30.0)
    with pytest.raises(kael.DTypeError, match="Gemma2Config"):
        Gemma2ForCausalLM(kael.models.Gemma3Config(hidden_size=32, num_attention_heads=2, num_hidden_layers=1))
    m = Gemma2ForCausalLM(cfg)
    assert len(m.generate([1, 2, 3, 4, 5, 6], 4)) == 4


#: The fields of a released checkpoint's config.json (Gemma 2 2B, transformers 4.42's layout: no layer_types).
RELEASED_2B = {
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 107],
    "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
    "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
    "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32",
    "use_cache": True, "vocab_size": 256000,
}  # fmt: skip


def test_a_released_config_reads_as_transformers_reads_it(tmp_path: Path) -> None:
    cfg, hf = gp.read_released_config(tmp_path, RELEASED_2B, read_config)
    assert cfg.layer_types == tuple(hf.layer_types) and cfg.sliding(0) and not cfg.sliding(25)
    assert (cfg.attn_logit_softcapping, cfg.final_logit_softcapping, cfg.sliding_window) == (50.0, 30.0, 4096)
    assert (cfg.rope_theta, cfg.scale, cfg.eos_ids, cfg.tie_word_embeddings) == (10000.0, 1 / 16, (1, 107), True)
