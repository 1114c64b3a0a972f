"""The Granite family (kael/models/granite/ over kael/models/llama/): Hugging Face Granite 3.x checkpoints that
transformers' ``GraniteForCausalLM`` writes offline with random weights (every multiplier away from 1) load
through ``kael.models.from_pretrained`` and compute transformers' logits, generate its greedy tokens, and decode
the same through the direct step (``GraniteDecodeStep``: ``LlamaDecodeStep`` with the multipliers), the KV
cache and the batched decoder with the paged cache.

Oracles: transformers' ``GraniteForCausalLM`` on the same weights (logits, greedy generate, save_pretrained read
back), the model's own full forward pass (the direct step, cache, batched rows), each row alone (batched
decoding, prefix cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_parity as fp
import kael
import pytest
from granite_checkpoints import MULTIPLIERS, SHAPES, build
from kael.models.granite import GraniteConfig, GraniteDecodeStep, GraniteForCausalLM, read_config

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pair = fp.pair_fixture(SHAPES, build, GraniteForCausalLM)


def test_registered_with_a_description() -> None:
    fp.check_registered("granite", "Granite", "multipliers")


def test_config_and_parameter_names(pair: fp.Pair) -> None:
    d, hf, model = pair
    cfg = read_config(d)
    assert isinstance(cfg, GraniteConfig) and cfg.model_type == "granite"
    for name in MULTIPLIERS:
        assert getattr(cfg, name) == getattr(hf.config, name) != 1.0, name
    assert cfg.dim == 16 and cfg.tie_word_embeddings == hf.config.tie_word_embeddings
    assert cfg.qkv_bias == cfg.o_bias == hf.config.attention_bias and cfg.mlp_bias == hf.config.mlp_bias
    fp.check_parameter_names(cfg, hf, model)
    assert all(layer.self_attn.scale == cfg.attention_multiplier for layer in model.model.layers)


def test_logits_match_transformers(pair: fp.Pair, backend: str) -> None:
    fp.check_logits(pair)


def test_each_multiplier_matters(pair: fp.Pair) -> None:
    """With one multiplier back at 1, transformers' logits move by far more than the 1e-4 kael matches them to:
    the parity above tests each multiplier."""
    _, hf, _ = pair
    base = fp.hf_logits(hf, [fp.PROMPTS[0]])[0]
    for name in MULTIPLIERS:
        old = getattr(hf.config, name)
        setattr(hf.config, name, 1.0)
        try:
            assert fp.logits_moved(hf, base) > 1e-2, name
        finally:
            setattr(hf.config, name, old)


def test_right_padded_batch_matches_transformers(pair: fp.Pair) -> None:
    fp.check_right_padded_batch(pair)


def test_incremental_cache_equals_the_full_pass(pair: fp.Pair) -> None:
    fp.check_incremental_cache(pair)


def test_greedy_generate_matches_transformers(pair: fp.Pair) -> None:
    fp.check_greedy_generate(pair)


def _multipliers(step: Any, model: Any) -> None:
    assert step.multipliers is not None and step.scale == model.config.attention_multiplier


@pytest.mark.parametrize("direct", [True, False])
def test_decode_step_equals_the_general_forward_pass(pair: fp.Pair, backend: str, direct: bool) -> None:
    """GraniteDecodeStep scales the embedding, both residual branches and the logits with the mul/div kernels and
    attends at attention_multiplier (fused or separate q/k/v)."""
    fp.check_decode_step(pair, backend, direct, GraniteForCausalLM, GraniteDecodeStep, _multipliers)


def test_quantized_decode_step_equals_its_forward_pass(pair: fp.Pair) -> None:
    """Q8_0 weights (quantized_linear kernels, fused q/k/v blocks, a quantized token table): the direct step with
    the multipliers still equals the model's own forward pass."""
    fp.check_quantized_decode_step(pair, GraniteDecodeStep)


def test_batched_rows_equal_each_alone(pair: fp.Pair, backend: str) -> None:
    fp.check_batched_rows(pair)


def test_tokens_at_positions_equal_one_step_at_a_time(pair: fp.Pair) -> None:
    fp.check_decode_entries(pair)


def test_prefix_cache_hits_give_each_row_its_tokens_alone(pair: fp.Pair) -> None:
    fp.check_prefix_cache(pair)


@pytest.mark.parametrize("save_dtype", ["bfloat16", "float16"])
def test_half_checkpoints_load_to_the_same_float32_values(tmp_path: Path, save_dtype: str) -> None:
    fp.check_half_checkpoint(tmp_path, save_dtype, build, SHAPES["tied-gqa"])


def _saved_multipliers(config: dict[str, Any], hf: Any) -> None:
    assert {k: config[k] for k in MULTIPLIERS} == {k: getattr(hf.config, k) for k in MULTIPLIERS}


def test_save_pretrained_is_read_by_transformers(tmp_path: Path, pair: fp.Pair) -> None:
    fp.check_save_pretrained(tmp_path, pair, "granite", "GraniteForCausalLM", _saved_multipliers)


def _config(tmp_path: Path, **changes: Any) -> Path:
    return fp.write_config(tmp_path, build, SHAPES["tied-gqa"], **changes)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"logits_scaling": 0}, "logits_scaling must not be 0"),
        ({"embedding_multiplier": "12"}, "embedding_multiplier"),
        ({"residual_multiplier": None}, "residual_multiplier"),
        ({"attention_multiplier": True}, "attention_multiplier"),
        ({"attention_bias": 1}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)  # fmt: skip
def test_configs_granite_cannot_run_are_refused_naming_the_field(
    tmp_path: Path, changes: dict[str, Any], match: str
) -> None:
    fp.check_refused(_config(tmp_path, **changes), match, "Granite config")


def test_config_class_checks() -> None:
    with pytest.raises(kael.ShapeError, match="model_type"):
        GraniteConfig(model_type="llama")
    with pytest.raises(kael.ShapeError, match="logits_scaling"):
        GraniteConfig(logits_scaling=0.0)
    with pytest.raises(kael.DTypeError, match="GraniteConfig"):
        GraniteForCausalLM(kael.models.LlamaConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=1))
    m = GraniteForCausalLM(GraniteConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                         num_attention_heads=2, max_position_embeddings=16,
                                         **MULTIPLIERS))  # fmt: skip
    assert "residual_multiplier=0.3" in repr(m)
    assert len(m.generate([1, 2, 3], 4)) == 4
