"""The Gemma 3 text family (kael/models/gemma3/ over kael/models/llama/): Hugging Face gemma3_text checkpoints that
transformers' ``Gemma3ForCausalLM`` writes offline with random weights load through ``kael.models.from_pretrained``
and compute transformers' logits (sliding windows of 4 to 8 positions, shorter than the prompts), generate its
greedy tokens, and decode the same through the generic step, the KV cache, the batched decoder and the paged
cache with prefix caching (several blocks per row: the window's keys gathered across blocks).

Oracles: transformers' ``Gemma3ForCausalLM`` on the same weights (logits, greedy generate), the model's own
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
from gemma3_checkpoints import SHAPES, build
from kael.models import from_pretrained
from kael.models.gemma3 import Gemma3Config, Gemma3ForCausalLM, read_config

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pair = fp.pair_fixture(SHAPES, build, Gemma3ForCausalLM)
LONG = gp.LONG


def test_registered_with_a_description() -> None:
    fp.check_registered("gemma3_text", "Gemma 3", "sliding-window", "GeGLU")


def test_config_and_parameter_names(pair: fp.Pair) -> None:
    d, hf, model = pair
    cfg = read_config(d)
    assert isinstance(cfg, Gemma3Config) and cfg.qk_norm and cfg.model_type == "gemma3_text"
    assert cfg.layer_types == tuple(hf.config.layer_types) and cfg.sliding_window == hf.config.sliding_window
    assert cfg.rope_theta == hf.config.rope_parameters["full_attention"]["rope_theta"]
    assert cfg.sliding_rope_theta == hf.config.rope_parameters["sliding_attention"]["rope_theta"]
    assert cfg.scale == hf.config.query_pre_attn_scalar**-0.5
    assert cfg.final_logit_softcapping == hf.config.final_logit_softcapping
    fp.check_parameter_names(cfg, hf, model)


def test_logits_match_transformers(pair: fp.Pair, backend: str) -> None:
    gp.check_logits(pair)


def test_the_window_matters(pair: fp.Pair) -> None:
    """A model whose sliding layers attend to everything gives other logits past the window (the mask is live)."""
    d, _, model = pair
    wide = Gemma3ForCausalLM.from_pretrained(d)
    for layer in wide.model.layers:
        layer.self_attn.window = None
    w = model.config.sliding_window
    base, other = fp.logits(model, LONG), fp.logits(wide, LONG)
    np.testing.assert_allclose(other[:w], base[:w], atol=1e-5, rtol=0)
    assert float(np.abs(other[w + 1 :] - base[w + 1 :]).max()) > 1e-2


def test_query_chunks_give_the_same_logits(pair: fp.Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [gemma query chunks]: whole prompts and chunked prefill with a cache."""
    gp.check_query_chunks(pair, monkeypatch, with_cache=True)


def test_right_padded_batch_matches_transformers(pair: fp.Pair) -> None:
    fp.check_right_padded_batch(pair)


def test_incremental_cache_equals_the_full_pass(pair: fp.Pair) -> None:
    fp.check_incremental_cache(pair)


def test_chunked_prefill_equals_the_full_pass(pair: fp.Pair) -> None:
    gp.check_chunked_prefill(pair)


def test_greedy_generate_matches_transformers(pair: fp.Pair) -> None:
    gp.check_greedy_generate(pair)


def test_decode_step_is_the_generic_one(pair: fp.Pair, backend: str) -> None:
    gp.check_generic_decode_step(pair, backend, Gemma3ForCausalLM)


def test_batched_rows_equal_each_alone(pair: fp.Pair, backend: str) -> None:
    fp.check_batched_rows(pair)


def test_tokens_at_positions_equal_one_step_at_a_time(pair: fp.Pair) -> None:
    fp.check_decode_entries(pair)


def test_prefix_cache_hits_give_each_row_its_tokens_alone(pair: fp.Pair) -> None:
    fp.check_prefix_cache(pair, hit_tokens=32)


@pytest.mark.usefixtures("float_activations")  # a float oracle (tests/conftest.py)
def test_q8_0_weights_decode_as_their_forward_pass(pair: fp.Pair) -> None:
    gp.check_q8_0_decode_step(pair)


def test_a_cuda_model_matches_the_cpu_one(pair: fp.Pair) -> None:
    """On a CUDA device (a GPU, or KAEL_CUDA_EMULATE=1's host emulation): the masks, tables and normalizer live
    on the model's device; logits within 1e-4 of the CPU model's, the same greedy tokens."""
    try:
        kael.empty(1, device="cuda")
    except kael.KaelError:
        pytest.skip("no usable cuda device (a GPU, or KAEL_CUDA_EMULATE=1 for host emulation)")
    d, _, cpu = pair
    gpu = from_pretrained(d, device="cuda")
    with kael.no_grad():
        got = np.asarray(gpu(kael.tensor([LONG], device="cuda"))._host()[0])
    np.testing.assert_allclose(got, fp.logits(cpu, LONG), atol=1e-4, rtol=0)
    assert gpu.generate(LONG[:9], 12) == cpu.generate(LONG[:9], 12)


@pytest.mark.parametrize("save_dtype", ["bfloat16", "float16"])
def test_half_checkpoints_load_to_the_same_float32_values(tmp_path: Path, save_dtype: str) -> None:
    fp.check_half_checkpoint(tmp_path, save_dtype, build, SHAPES["gqa"])


def test_bfloat16_model_matches_transformers_in_bfloat16(tmp_path: Path) -> None:
    """dtype "auto" of a bf16 checkpoint computes in bf16 near transformers' bf16 model (the normalizer and the
    norms' float32 (1 + w) as transformers rounds them)."""
    hf = build(tmp_path, seed=3, save_dtype=torch.bfloat16, **SHAPES["gqa"])
    model = from_pretrained(tmp_path, dtype="auto")
    assert model.dtype is kael.bfloat16
    ids = fp.PROMPTS[0]
    with kael.no_grad():
        got = kael.ops.to(model(kael.tensor([ids])), dtype=kael.float32).numpy()[0]
    with torch.no_grad():
        want = hf.to(torch.bfloat16)(torch.tensor([ids])).logits.float().numpy()[0]
    # bf16 rounding of every activation, in a different order: about 1% of the largest logit
    assert float(np.abs(got - want).max()) < 0.02 * float(np.abs(want).max())


def test_save_pretrained_is_read_by_transformers(tmp_path: Path, pair: fp.Pair) -> None:
    def check(config: dict[str, Any], hf: Any) -> None:
        assert config["layer_types"] == hf.config.layer_types
        assert set(config["rope_parameters"]) == {"full_attention", "sliding_attention"}

    fp.check_save_pretrained(tmp_path, pair, "gemma3_text", "Gemma3ForCausalLM", check)


def _config(tmp_path: Path, **changes: Any) -> Path:
    return fp.write_config(tmp_path, build, SHAPES["gqa"], **changes)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"hidden_activation": "gelu"}, "hidden_activation"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        ({"final_logit_softcapping": -1}, "final_logit_softcapping"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
        ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}, "layer_types"),
        ({"layer_types": None, "sliding_window_pattern": 0}, "sliding_window_pattern"),
        ({"query_pre_attn_scalar": "256"}, "query_pre_attn_scalar"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}, "rope_parameters"),
        ({"rope_parameters": {"full_attention": {"rope_type": "su"}}}, "rope type"),
        ({"rope_parameters": {"sliding_attention": {"rope_theta": 0.5}}}, "sliding_attention"),
        ({"attention_bias": 1}, "attention_bias"),
        ({"head_dim": 15}, "head_dim"),
        ({"model_type": "gemma3"}, "text_config is missing"),  # the multimodal type keeps its text model there
    ],
)  # fmt: skip
def test_configs_gemma3_cannot_run_are_refused_naming_the_field(
    tmp_path: Path, changes: dict[str, Any], match: str
) -> None:
    d = _config(tmp_path, **changes)
    fp.check_refused(d, match, "Gemma3 config")


def test_legacy_rope_keys_are_read(tmp_path: Path) -> None:
    """transformers 4's rope_theta / rope_local_base_freq / rope_scaling give the same two rotary settings."""
    d = _config(tmp_path, rope_parameters=None, rope_theta=2000.0, rope_local_base_freq=30.0,
                rope_scaling={"rope_type": "linear", "factor": 4.0})  # fmt: skip
    cfg = read_config(d)
    assert (cfg.rope_theta, cfg.rope_scaling.rope_type, cfg.rope_scaling.get("factor")) == (2000.0, "linear", 4.0)
    assert (cfg.sliding_rope_theta, cfg.sliding_rope_scaling.rope_type) == (30.0, "default")


def test_missing_post_feedforward_norm_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    build(tmp_path, **SHAPES["gqa"])
    f = tmp_path / "model.safetensors"
    tensors = load_file(f)
    del tensors["model.layers.1.post_feedforward_layernorm.weight"]
    save_file(tensors, f, metadata={"format": "pt"})
    with pytest.raises(kael.FormatError, match=r"model\.layers\.1\.post_feedforward_layernorm\.weight"):
        from_pretrained(tmp_path)


def test_config_class_checks() -> None:
    with pytest.raises(kael.ShapeError, match="model_type"):
        Gemma3Config(model_type="llama")
    with pytest.raises(kael.ShapeError, match="layer_types"):
        Gemma3Config(num_hidden_layers=2, layer_types=("sliding_attention",))
    with pytest.raises(kael.DTypeError, match="Gemma3Config"):
        Gemma3ForCausalLM(kael.models.LlamaConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=1))
    cfg = Gemma3Config(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=7,
                       num_attention_heads=2, head_dim=8, max_position_embeddings=16, sliding_window=4)  # fmt: skip
    assert [cfg.sliding(i) for i in range(7)] == [True] * 5 + [False, True]  # every sixth layer full
    m = Gemma3ForCausalLM(cfg)
    assert (m.model.layers[0].self_attn.k_norm.weight.detach().numpy() == 0).all()  # transformers' init: 1 + 0
    assert len(m.generate([1, 2, 3, 4, 5, 6], 4)) == 4


#: The fields of a released checkpoint's config.json (Gemma 3 1B, transformers 4.50's layout: legacy rope keys,
#: a sliding_window_pattern and no layer_types).
RELEASED_1B = {
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106],
    "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
    "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
    "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 262144,
}  # fmt: skip


def test_a_released_config_reads_as_transformers_reads_it(tmp_path: Path) -> None:
    cfg, hf = gp.read_released_config(tmp_path, RELEASED_1B, read_config)
    assert cfg.layer_types == tuple(hf.layer_types) and [i for i, t in enumerate(hf.layer_types) if t[0] == "f"] == [
        5,
        11,
        17,
        23,
    ]
    assert (
        (cfg.rope_theta, cfg.sliding_rope_theta)
        == (1e6, 1e4)
        == (hf.rope_parameters["full_attention"]["rope_theta"], hf.rope_parameters["sliding_attention"]["rope_theta"])
    )
    assert (cfg.sliding_window, cfg.scale, cfg.eos_ids, cfg.tie_word_embeddings) == (512, 1 / 16, (1, 106), True)
    assert (cfg.dim, cfg.kv_heads, cfg.dtype) == (256, 1, "bfloat16")
