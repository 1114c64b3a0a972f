"""The OLMo 2 family (kael/models/olmo2/ over kael/models/llama/): Hugging Face OLMo 2 checkpoints that
transformers' ``Olmo2ForCausalLM`` writes offline with random weights load through
``kael.models.from_pretrained`` and compute transformers' logits, generate its greedy tokens, and decode the
same through the direct step (``Olmo2DecodeStep``: post-norms, whole-projection q/k norms), the KV cache and
the batched decoder with the paged cache.

Oracles: transformers' ``Olmo2ForCausalLM`` on the same weights (logits, greedy generate), the model's own
full forward pass (the direct step, cache, batched rows), each row alone (batched decoding, prefix cache).
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
from kael.models.olmo2 import Olmo2Config, Olmo2DecodeStep, Olmo2ForCausalLM, read_config
from olmo2_checkpoints import SHAPES, build

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pair = fp.pair_fixture(SHAPES, build, Olmo2ForCausalLM)


def _whole_norms(step: Any, model: Any) -> None:
    """The step's q/k norm weights are the whole-projection ones [H*D] / [Hkv*D]; its norm slots OLMo 2's."""
    c = model.config
    for lay, blk in zip(step.layers, model.model.layers):
        assert lay.q_norm.shape == (c.num_attention_heads * c.dim,) and lay.k_norm.shape == (c.kv_heads * c.dim,)
        assert lay.in_norm is blk.post_attention_layernorm.weight
        assert lay.post_norm is blk.post_feedforward_layernorm.weight


def test_registered_with_a_description() -> None:
    fp.check_registered("olmo2", "OLMo 2", "post-norms", "whole projection")


def test_config_and_parameter_names(pair: fp.Pair) -> None:
    d, hf, model = pair
    cfg = read_config(d)
    assert isinstance(cfg, Olmo2Config) and cfg.model_type == "olmo2" and not cfg.qk_norm
    hd = getattr(hf.config, "head_dim", None) or hf.config.hidden_size // hf.config.num_attention_heads
    assert cfg.dim == hd and cfg.tie_word_embeddings == hf.config.tie_word_embeddings
    assert cfg.qkv_bias == cfg.o_bias == hf.config.attention_bias and not cfg.mlp_bias
    fp.check_parameter_names(cfg, hf, model)
    attn = model.model.layers[0].self_attn
    assert attn.q_norm.weight.shape == (cfg.num_attention_heads * cfg.dim,)
    assert attn.k_norm.weight.shape == (cfg.kv_heads * cfg.dim,)
    assert not hasattr(model.model.layers[0], "input_layernorm")


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
    """Olmo2DecodeStep normalises q and k over the whole projection and each branch's output (fused or separate
    q/k/v); the generic step runs the model's own forward."""
    fp.check_decode_step(pair, backend, direct, Olmo2ForCausalLM, Olmo2DecodeStep, _whole_norms)


def test_quantized_decode_step_equals_its_forward_pass(pair: fp.Pair) -> None:
    """Q8_0 weights (quantized_linear kernels, fused q/k/v blocks): the direct step still equals the model's own
    forward pass, and greedy generate runs it."""
    fp.check_quantized_decode_step(pair, Olmo2DecodeStep, _whole_norms)


def test_batched_rows_equal_each_alone(pair: fp.Pair, backend: str) -> None:
    fp.check_batched_rows(pair)


def test_tokens_at_positions_equal_one_step_at_a_time(pair: fp.Pair) -> None:
    fp.check_decode_entries(pair)


def test_prefix_cache_hits_give_each_row_its_tokens_alone(pair: fp.Pair) -> None:
    fp.check_prefix_cache(pair, hit_tokens=32)


@pytest.mark.parametrize("save_dtype", ["bfloat16", "float16"])
def test_half_checkpoints_load_to_the_same_float32_values(tmp_path: Path, save_dtype: str) -> None:
    fp.check_half_checkpoint(tmp_path, save_dtype, build, SHAPES["tied-hd24-bias"])


def _saved(config: dict[str, Any], hf: Any) -> None:
    assert config["attention_bias"] == hf.config.attention_bias and "mlp_bias" not in config


def test_save_pretrained_is_read_by_transformers(tmp_path: Path, pair: fp.Pair) -> None:
    fp.check_save_pretrained(tmp_path, pair, "olmo2", "Olmo2ForCausalLM", _saved)


def _config(tmp_path: Path, **changes: Any) -> Path:
    return fp.write_config(tmp_path, build, SHAPES["untied-gqa"], **changes)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"attention_bias": 1}, "attention_bias"),
        ({"head_dim": 15}, "head_dim"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0}}, "longrope"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
         "partial_rotary_factor"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"rms_norm_eps": 0}, "rms_norm_eps"),
    ],
)  # fmt: skip
def test_configs_olmo2_cannot_run_are_refused_naming_the_field(
    tmp_path: Path, changes: dict[str, Any], match: str
) -> None:
    fp.check_refused(_config(tmp_path, **changes), match, "OLMo 2 config")


def test_a_missing_size_is_refused(tmp_path: Path) -> None:
    d = _config(tmp_path)
    p = d / "config.json"
    cfg = json.loads(p.read_text())
    del cfg["hidden_size"]
    p.write_text(json.dumps(cfg))
    fp.check_refused(d, "hidden_size", "OLMo 2 config")


def test_transformers_defaults_where_config_json_is_silent(tmp_path: Path) -> None:
    """rms_norm_eps 1e-5 and eos_token_id 50279 (transformers' Olmo2Config), not the Llama reader's defaults; a
    sliding_window key is ignored, as transformers' OLMo 2 ignores it."""
    d = _config(tmp_path, sliding_window=4)
    p = d / "config.json"
    cfg = json.loads(p.read_text())
    del cfg["rms_norm_eps"], cfg["eos_token_id"]
    p.write_text(json.dumps(cfg))
    c = read_config(d)
    assert c.rms_norm_eps == 1e-5 and c.eos_token_id == 50279
    assert isinstance(from_pretrained(d), Olmo2ForCausalLM)


@pytest.mark.parametrize(
    "key", ["model.layers.1.self_attn.q_norm.weight", "model.layers.0.post_feedforward_layernorm.weight"]
)
def test_a_missing_olmo2_tensor_is_named(tmp_path: Path, key: str) -> None:
    from safetensors.torch import load_file, save_file

    build(tmp_path, **SHAPES["untied-gqa"])
    f = tmp_path / "model.safetensors"
    tensors = load_file(f)
    del tensors[key]
    save_file(tensors, f, metadata={"format": "pt"})
    with pytest.raises(kael.FormatError, match=key.replace(".", r"\.")) as err:
        from_pretrained(tmp_path)
    assert "model.safetensors" in str(err.value) or str(tmp_path) in str(err.value)


def test_a_per_head_q_norm_is_refused_by_shape(tmp_path: Path) -> None:
    """A q_norm of head_dim values (Qwen3's per-head layout) is not OLMo 2's: refused, naming the tensor."""
    from safetensors.torch import load_file, save_file

    build(tmp_path, **SHAPES["untied-gqa"])
    f = tmp_path / "model.safetensors"
    tensors = load_file(f)
    tensors["model.layers.0.self_attn.q_norm.weight"] = torch.ones(16)
    save_file(tensors, f, metadata={"format": "pt"})
    with pytest.raises(kael.FormatError, match=r"model\.layers\.0\.self_attn\.q_norm\.weight"):
        from_pretrained(tmp_path)


def test_config_class_checks() -> None:
    with pytest.raises(kael.ShapeError, match="model_type"):
        Olmo2Config(model_type="llama")
    with pytest.raises(kael.ShapeError, match="qk_norm"):
        Olmo2Config(qk_norm=True)
    with pytest.raises(kael.ShapeError, match="mlp_bias"):
        Olmo2Config(mlp_bias=True)
    with pytest.raises(kael.DTypeError, match="Olmo2Config"):
        Olmo2ForCausalLM(kael.models.LlamaConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=1))
    m = Olmo2ForCausalLM(Olmo2Config(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                     num_attention_heads=2, head_dim=8, max_position_embeddings=16))  # fmt: skip
    assert m.config.rms_norm_eps == 1e-5
    assert (m.model.layers[0].self_attn.k_norm.weight.detach().numpy() == 1).all()  # transformers' init: unit norms
    assert (m.model.layers[0].post_feedforward_layernorm.weight.detach().numpy() == 1).all()
    assert np.abs(m.model.layers[0].self_attn.q_proj.weight.detach().numpy()).max() > 0
    assert len(m.generate([1, 2, 3], 4)) == 4


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_norm_rounds_once_after_the_weight_as_transformers(dtype: str) -> None:
    """Olmo2RMSNorm in a half dtype equals transformers' Olmo2RMSNorm bit for bit (weight times the float32
    normalised value, rounded once), where Llama's rounding (rms_norm: round, then the weight) does not."""
    from kael.models.olmo2 import Olmo2RMSNorm
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm as HFNorm

    torch.manual_seed(0)
    tdt, kdt = getattr(torch, dtype), getattr(kael, dtype)
    hf = HFNorm(96, eps=1e-6).to(tdt)
    with torch.no_grad():
        hf.weight.normal_(1.0, 0.3)
        x = (torch.randn(3, 5, 96) * 3).to(tdt)
        want = hf(x).float().numpy()
    norm = Olmo2RMSNorm(96, eps=1e-6, dtype=kdt)
    with kael.no_grad():
        norm.load_state_dict({"weight": kael.ops.to(kael.tensor(hf.weight.float().detach().numpy()), dtype=kdt)})
        kx = kael.ops.to(kael.tensor(x.float().numpy()), dtype=kdt)
        got = kael.ops.to(norm(kx), dtype=kael.float32).numpy()
        llama = kael.ops.to(kael.ops.rms_norm(kx, norm.weight, 1e-6), dtype=kael.float32).numpy()
    np.testing.assert_array_equal(got, want)
    assert (llama != want).any()


def test_a_half_model_decodes_with_the_generic_step(tmp_path: Path) -> None:
    """dtype="auto" on a bfloat16 checkpoint computes in bfloat16 with OLMo 2's norm rounding: the direct step
    (Llama's rms_norm rounding) gives way to the generic step over the model's forward."""
    from kael.models import GenericStep, decode_step

    build(tmp_path, save_dtype=torch.bfloat16, **SHAPES["untied-gqa"])
    model = from_pretrained(tmp_path, dtype="auto")
    assert model.dtype is kael.bfloat16
    cache = model.new_cache(max_positions=16)
    with kael.no_grad():
        model(kael.tensor([[3, 4, 5]]), cache)
        assert isinstance(decode_step(model, cache), GenericStep)
    assert len(model.generate([3, 4, 5], 6)) == 6
