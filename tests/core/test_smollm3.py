"""The SmolLM3 family (kael/models/smollm3/ over kael/models/llama/): Hugging Face SmolLM3 checkpoints that
transformers' ``SmolLM3ForCausalLM`` writes offline with random weights (layers without rope: transformers'
default pattern and one of the test's own) load through ``kael.models.from_pretrained`` and compute
transformers' logits, generate its greedy tokens, and decode the same through the direct step
(``LlamaDecodeStep`` copying q and k on the no-rope layers), the KV cache and the batched decoder with the
paged cache.

Oracles: transformers' ``SmolLM3ForCausalLM`` and ``SmolLM3Config`` (logits, greedy generate, the derived
``no_rope_layers`` and rope_theta, save_pretrained read back), the model's own full forward pass (the direct step,
cache, batched rows), each row alone (batched decoding, prefix cache).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import family_parity as fp
import kael
import pytest
from kael.models import from_pretrained
from kael.models.llama import LlamaDecodeStep
from kael.models.smollm3 import DEFAULT_THETA, SmolLM3Config, SmolLM3ForCausalLM, read_config
from smollm3_checkpoints import SHAPES, build

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pair = fp.pair_fixture(SHAPES, build, SmolLM3ForCausalLM)


def test_registered_with_a_description() -> None:
    fp.check_registered("smollm3", "SmolLM3", "no_rope_layers")


def test_config_and_parameter_names(pair: fp.Pair) -> None:
    d, hf, model = pair
    cfg = read_config(d)
    assert isinstance(cfg, SmolLM3Config) and cfg.model_type == "smollm3"
    assert list(cfg.no_rope_layers or ()) == hf.config.no_rope_layers and 0 in hf.config.no_rope_layers
    assert [layer.self_attn.rope for layer in model.model.layers] == [bool(f) for f in hf.config.no_rope_layers]
    assert cfg.dim == 16 and cfg.tie_word_embeddings == hf.config.tie_word_embeddings
    assert cfg.qkv_bias == cfg.o_bias == hf.config.attention_bias and cfg.mlp_bias == hf.config.mlp_bias
    fp.check_parameter_names(cfg, hf, model)


def test_logits_match_transformers(pair: fp.Pair, backend: str) -> None:
    fp.check_logits(pair)


def test_the_no_rope_layers_matter(pair: fp.Pair) -> None:
    """With rope on every layer transformers' logits move by far more than the 1e-4 kael matches them to: the
    parity above tests the no-rope layers."""
    _, hf, _ = pair
    base = fp.hf_logits(hf, [fp.PROMPTS[0]])[0]
    old = hf.config.no_rope_layers
    hf.config.no_rope_layers = [1] * len(old)
    try:
        assert fp.logits_moved(hf, base) > 1e-2
    finally:
        hf.config.no_rope_layers = old


def test_right_padded_batch_matches_transformers(pair: fp.Pair) -> None:
    fp.check_right_padded_batch(pair)


def test_incremental_cache_equals_the_full_pass(pair: fp.Pair) -> None:
    fp.check_incremental_cache(pair)


def test_greedy_generate_matches_transformers(pair: fp.Pair) -> None:
    fp.check_greedy_generate(pair)


def _rope_flags(step: Any, model: Any) -> None:
    assert [lay.rope for lay in step.layers] == [bool(f) for f in model.config.no_rope_layers or ()]


@pytest.mark.parametrize("direct", [True, False])
def test_decode_step_equals_the_general_forward_pass(pair: fp.Pair, backend: str, direct: bool) -> None:
    """LlamaDecodeStep copies q and k where it would rotate them on the no-rope layers (fused or separate q/k/v).
    Within 4e-5: the prefill's products of more than 16 rows sum in another order than one row's, and this
    checkpoint's init (0.2) amplifies that most of the families: measured 1.97e-5, and 2.19e-5 since rms_norm sums
    float32-rounded squares (a last-bit change of the mean in some rows), on logits of std about 1.6."""
    fp.check_decode_step(pair, backend, direct, SmolLM3ForCausalLM, LlamaDecodeStep, _rope_flags, atol=4e-5)


def test_quantized_decode_step_equals_its_forward_pass(pair: fp.Pair) -> None:
    """Q8_0 weights (quantized_linear kernels, fused q/k/v blocks, a quantized token table): the direct step with
    the no-rope layers still equals the model's own forward pass."""
    fp.check_quantized_decode_step(pair, LlamaDecodeStep)


def test_batched_rows_equal_each_alone(pair: fp.Pair, backend: str) -> None:
    fp.check_batched_rows(pair)


def test_tokens_at_positions_equal_one_step_at_a_time(pair: fp.Pair) -> None:
    fp.check_decode_entries(pair)


def test_prefix_cache_hits_give_each_row_its_tokens_alone(pair: fp.Pair) -> None:
    fp.check_prefix_cache(pair)


@pytest.mark.parametrize("save_dtype", ["bfloat16", "float16"])
def test_half_checkpoints_load_to_the_same_float32_values(tmp_path: Path, save_dtype: str) -> None:
    fp.check_half_checkpoint(tmp_path, save_dtype, build, SHAPES["tied-default"])


def _saved_flags(config: dict[str, Any], hf: Any) -> None:
    assert config["no_rope_layers"] == hf.config.no_rope_layers


def test_save_pretrained_is_read_by_transformers(tmp_path: Path, pair: fp.Pair) -> None:
    fp.check_save_pretrained(tmp_path, pair, "smollm3", "SmolLM3ForCausalLM", _saved_flags)


def _config(tmp_path: Path, **changes: Any) -> Path:
    return fp.write_config(tmp_path, build, SHAPES["tied-default"], **changes)


def test_defaults_are_transformers(tmp_path: Path) -> None:
    """A config.json without no_rope_layers (derived from no_rope_layer_interval), rope_theta or
    tie_word_embeddings reads as transformers' SmolLM3Config reads it."""
    import transformers

    d = _config(tmp_path, no_rope_layers=None, no_rope_layer_interval=2)
    p = d / "config.json"
    raw = json.loads(p.read_text())
    for key in ("rope_parameters", "rope_theta", "tie_word_embeddings"):
        raw.pop(key, None)
    p.write_text(json.dumps(raw))
    want = transformers.AutoConfig.from_pretrained(d)
    cfg = read_config(d)
    assert list(cfg.no_rope_layers or ()) == want.no_rope_layers == [1, 0, 1, 0]
    assert cfg.rope_theta == want.rope_parameters["rope_theta"] == DEFAULT_THETA
    assert cfg.tie_word_embeddings == want.tie_word_embeddings is True


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"no_rope_layers": [1, 0, 1]}, "no_rope_layers must be a list of 4"),
        ({"no_rope_layers": [1, 0, 2, 1]}, "no_rope_layers"),
        ({"no_rope_layers": None, "no_rope_layer_interval": 0}, "no_rope_layer_interval"),
        ({"use_sliding_window": True, "sliding_window": 16, "layer_types": "sliding"}, "layer_types"),
        ({"use_sliding_window": "yes"}, "use_sliding_window"),
        ({"attention_bias": 1}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)  # fmt: skip
def test_configs_smollm3_cannot_run_are_refused_naming_the_field(
    tmp_path: Path, changes: dict[str, Any], match: str
) -> None:
    fp.check_refused(_config(tmp_path, **changes), match, "SmolLM3 config")


def test_a_window_no_layer_uses_is_accepted(tmp_path: Path) -> None:
    """use_sliding_window with every layer full (layer_types), or a window covering the context, attends as full
    attention does in transformers too."""
    types = ["full_attention"] * 4
    d = _config(tmp_path, use_sliding_window=True, sliding_window=16, layer_types=types)
    assert isinstance(from_pretrained(d), SmolLM3ForCausalLM)
    d = _config(tmp_path, use_sliding_window=True, sliding_window=96, layer_types=None)
    assert isinstance(from_pretrained(d), SmolLM3ForCausalLM)


def test_config_class_checks() -> None:
    with pytest.raises(kael.ShapeError, match="model_type"):
        SmolLM3Config(model_type="llama")
    with pytest.raises(kael.ShapeError, match="no_rope_layers"):
        SmolLM3Config(num_hidden_layers=2, no_rope_layers=(1,))
    with pytest.raises(kael.DTypeError, match="SmolLM3Config"):
        SmolLM3ForCausalLM(kael.models.LlamaConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=1))
    cfg = SmolLM3Config(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                        num_attention_heads=2, max_position_embeddings=16)  # fmt: skip
    assert cfg.no_rope_layers == (1, 1, 1, 0) and cfg.rope_theta == DEFAULT_THETA and cfg.tie_word_embeddings
    m = SmolLM3ForCausalLM(cfg)
    assert "no_rope_layers=[1, 1, 1, 0]" in repr(m) and not m.model.layers[3].self_attn.rope
    assert len(m.generate([1, 2, 3], 4)) == 4
