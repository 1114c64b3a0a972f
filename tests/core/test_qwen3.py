"""The Qwen3 family (kael/models/qwen3/ over kael/models/llama/): Hugging Face Qwen3 checkpoints that
transformers' ``Qwen3ForCausalLM`` writes offline with random weights load through
``kael.models.from_pretrained`` and compute transformers' logits, generate its greedy tokens, and decode
the same through the direct step (``LlamaDecodeStep`` with the per-head q/k norms), the KV cache and the
batched decoder with the paged cache.

Oracles: transformers' ``Qwen3ForCausalLM`` on the same weights (logits, greedy generate), the model's own
full forward pass (the direct step, cache, batched rows), each row alone (batched decoding, prefix cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_parity as fp
import kael
import pytest
from kael.models import from_pretrained
from kael.models.llama import LlamaDecodeStep
from kael.models.qwen3 import Qwen3Config, Qwen3ForCausalLM, read_config
from qwen3_checkpoints import SHAPES, build

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pair = fp.pair_fixture(SHAPES, build, Qwen3ForCausalLM)


def _q_norms(step: Any, model: Any) -> None:
    assert all(lay.q_norm is not None for lay in step.layers)


def test_registered_with_a_description() -> None:
    fp.check_registered("qwen3", "Qwen3", "q/k")


def test_config_and_parameter_names(pair: fp.Pair) -> None:
    d, hf, model = pair
    cfg = read_config(d)
    assert isinstance(cfg, Qwen3Config) and cfg.qk_norm and cfg.model_type == "qwen3"
    assert cfg.dim == hf.config.head_dim and cfg.tie_word_embeddings == hf.config.tie_word_embeddings
    assert cfg.qkv_bias == cfg.o_bias == hf.config.attention_bias and not cfg.mlp_bias
    fp.check_parameter_names(cfg, hf, model)
    assert model.model.layers[0].self_attn.q_norm.weight.shape == (cfg.dim,)


def test_logits_match_transformers(pair: fp.Pair, backend: str) -> None:
    fp.check_logits(pair)


def test_right_padded_batch_matches_transformers(pair: fp.Pair) -> None:
    fp.check_right_padded_batch(pair)


def test_incremental_cache_equals_the_full_pass(pair: fp.Pair) -> None:
    fp.check_incremental_cache(pair)


def test_greedy_generate_matches_transformers(pair: fp.Pair) -> None:
    fp.check_greedy_generate(pair)


@pytest.mark.parametrize("direct", [True, False])
def test_decode_step_equals_the_general_forward_pass(pair: fp.Pair, backend: str, direct: bool) -> None:
    """LlamaDecodeStep applies q_norm / k_norm per head with the rms_norm kernel (fused or separate q/k/v)."""
    fp.check_decode_step(pair, backend, direct, Qwen3ForCausalLM, LlamaDecodeStep, _q_norms)


def test_quantized_decode_step_equals_its_forward_pass(pair: fp.Pair) -> None:
    """Q8_0 weights (quantized_linear kernels, fused q/k/v blocks): the direct step with the q/k norms still
    equals the model's own forward pass, and greedy generate runs it."""
    fp.check_quantized_decode_step(pair, LlamaDecodeStep, _q_norms)


def test_batched_rows_equal_each_alone(pair: fp.Pair, backend: str) -> None:
    fp.check_batched_rows(pair)


def test_tokens_at_positions_equal_one_step_at_a_time(pair: fp.Pair) -> None:
    fp.check_decode_entries(pair)


def test_prefix_cache_hits_give_each_row_its_tokens_alone(pair: fp.Pair) -> None:
    """The paged cache with prefix caching: prompts sharing whole cached blocks reuse them (only the suffix
    runs), the hit's first logits equal a cold prefill's, and the rows decoded together give the tokens of
    each alone (generate)."""
    fp.check_prefix_cache(pair, hit_tokens=32)


@pytest.mark.parametrize("save_dtype", ["bfloat16", "float16"])
def test_half_checkpoints_load_to_the_same_float32_values(tmp_path: Path, save_dtype: str) -> None:
    fp.check_half_checkpoint(tmp_path, save_dtype, build, SHAPES["tied-hd24"])


def test_save_pretrained_is_read_by_transformers(tmp_path: Path, pair: fp.Pair) -> None:
    fp.check_save_pretrained(tmp_path, pair, "qwen3", "Qwen3ForCausalLM")


def _config(tmp_path: Path, **changes: Any) -> Path:
    return fp.write_config(tmp_path, build, SHAPES["tied-hd24"], **changes)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"use_sliding_window": True, "sliding_window": 16, "layer_types": ["sliding_attention"]}, "layer_types"),
        ({"use_sliding_window": True, "sliding_window": 16, "layer_types": ["full", "sliding"]}, "layer_types"),
        ({"use_sliding_window": True, "sliding_window": -3}, "sliding_window"),
        ({"use_sliding_window": "yes"}, "use_sliding_window"),
        ({"attention_bias": 1}, "attention_bias"),
        ({"head_dim": 15}, "head_dim"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)  # fmt: skip
def test_configs_qwen3_cannot_run_are_refused_naming_the_field(
    tmp_path: Path, changes: dict[str, Any], match: str
) -> None:
    fp.check_refused(_config(tmp_path, **changes), match, "Qwen3 config")


def test_sliding_windows_no_layer_uses_are_accepted(tmp_path: Path) -> None:
    """use_sliding_window with every layer full (max_window_layers past the last), or a window covering the
    context, attends as full attention does in transformers too."""
    d = _config(tmp_path, use_sliding_window=True, sliding_window=16, max_window_layers=2, layer_types=None)
    assert isinstance(from_pretrained(d), Qwen3ForCausalLM)
    d = _config(tmp_path, use_sliding_window=True, sliding_window=96, max_window_layers=0, layer_types=None)
    assert isinstance(from_pretrained(d), Qwen3ForCausalLM)


def test_missing_q_norm_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    build(tmp_path, **SHAPES["tied-hd24"])
    f = tmp_path / "model.safetensors"
    tensors = load_file(f)
    del tensors["model.layers.1.self_attn.q_norm.weight"]
    save_file(tensors, f, metadata={"format": "pt"})
    with pytest.raises(kael.FormatError, match=r"model\.layers\.1\.self_attn\.q_norm\.weight"):
        from_pretrained(tmp_path)


def test_config_class_checks() -> None:
    with pytest.raises(kael.ShapeError, match="model_type"):
        Qwen3Config(model_type="llama")
    with pytest.raises(kael.DTypeError, match="Qwen3Config"):
        Qwen3ForCausalLM(kael.models.LlamaConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=1))
    m = Qwen3ForCausalLM(Qwen3Config(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                     num_attention_heads=2, head_dim=8, max_position_embeddings=16))  # fmt: skip
    assert (m.model.layers[0].self_attn.k_norm.weight.detach().numpy() == 1).all()  # transformers' init: unit norms
    assert len(m.generate([1, 2, 3], 4)) == 4
