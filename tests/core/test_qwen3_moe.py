"""The Qwen3-MoE family (kael/models/qwen3_moe/ over kael/models/llama/): Hugging Face Qwen3-MoE checkpoints
that transformers' ``Qwen3MoeForCausalLM`` writes offline with random weights load through
``kael.models.from_pretrained`` and compute transformers' logits (every layer sparse, every second one, dense
layers listed in ``mlp_only_layers``; top-1 to top-3 of 4 to 8 experts, renormalised or not), generate its
greedy tokens, and decode the same through the KV cache and the batched decoder with the paged cache (the
direct decode step ``Qwen3MoeDecodeStep``: tests/core/test_qwen3_moe_step.py).

Oracles: transformers' ``Qwen3MoeForCausalLM`` on the same weights (logits, greedy generate), the model's own
full forward pass (the cache, the expert-by-expert path, Q8_0 weights), each row alone (batched decoding).
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
from kael.models.qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM, Qwen3MoeSparseMoeBlock, read_config
from kael.quant import QuantizedLinear
from qwen3_moe_checkpoints import SHAPES, build

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pair = fp.pair_fixture(SHAPES, build, Qwen3MoeForCausalLM)


def _sparse(model: Any) -> list[bool]:
    return [isinstance(layer.mlp, Qwen3MoeSparseMoeBlock) for layer in model.model.layers]


def test_registered_with_a_description() -> None:
    fp.check_registered("qwen3_moe", "Qwen3-MoE", "mixture-of-experts")


def test_config_and_parameter_names(pair: fp.Pair) -> None:
    d, hf, model = pair
    cfg = read_config(d)
    c = hf.config
    assert isinstance(cfg, Qwen3MoeConfig) and cfg.qk_norm and cfg.model_type == "qwen3_moe"
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (
        c.num_experts,
        c.num_experts_per_tok,
        c.moe_intermediate_size,
        c.norm_topk_prob,
    )
    assert cfg.qkv_bias == cfg.o_bias == c.attention_bias and not cfg.mlp_bias
    from safetensors import safe_open

    with safe_open(str(d / "model.safetensors"), "np") as f:  # the saved keys: one matrix per expert
        want = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    if cfg.tie_word_embeddings:
        want.pop("lm_head.weight", None)
    assert {k: tuple(p.shape) for k, p in model.named_parameters()} == want
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in want and "model.layers.1.mlp.gate.weight" in want
    assert _sparse(model) == [type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for layer in hf.model.layers]


def test_logits_match_transformers(pair: fp.Pair, backend: str) -> None:
    fp.check_logits(pair)


def test_expert_by_expert_path_gives_the_same_logits(pair: fp.Pair) -> None:
    """With gradients on, the sparse blocks run each expert's own modules (NOTE [stacked experts]): the same
    logits as the stacked expert_linear path, and gradients reach every expert that was routed to."""
    _, hf, model = pair
    with kael.no_grad():
        assert all(layer.mlp._stacked() is not None for layer in model.model.layers if hasattr(layer.mlp, "fuse"))
    ids = fp.PROMPTS[0]
    out = model(kael.tensor([ids]))
    assert all(layer.mlp._stacked() is None for layer in model.model.layers if hasattr(layer.mlp, "fuse"))
    np.testing.assert_allclose(out.detach().numpy()[0], fp.logits(model, ids), atol=2e-5, rtol=0)
    kael.sum(out).backward()
    block = next(layer.mlp for layer in model.model.layers if isinstance(layer.mlp, Qwen3MoeSparseMoeBlock))
    assert block.gate.weight.grad is not None and any(m.up_proj.weight.grad is not None for m in block.experts)
    model.zero_grad()


def test_right_padded_batch_matches_transformers(pair: fp.Pair) -> None:
    fp.check_right_padded_batch(pair)


def test_incremental_cache_equals_the_full_pass(pair: fp.Pair) -> None:
    fp.check_incremental_cache(pair)


def test_greedy_generate_matches_transformers(pair: fp.Pair) -> None:
    _, hf, model = pair
    for ids in fp.PROMPTS[:2]:
        assert model.generate(ids, 32) == fp.hf_greedy(hf, ids, 32)


def test_batched_rows_equal_each_alone(pair: fp.Pair, backend: str) -> None:
    fp.check_batched_rows(pair)


def test_tokens_at_positions_equal_one_step_at_a_time(pair: fp.Pair) -> None:
    fp.check_decode_entries(pair)


def test_mapped_load_runs_expert_by_expert_with_the_same_logits(pair: fp.Pair) -> None:
    d, _, model = pair
    mapped = Qwen3MoeForCausalLM.from_pretrained(d, mmap=True)
    with kael.no_grad():
        assert all(layer.mlp._stacked() is None for layer in mapped.model.layers if hasattr(layer.mlp, "fuse"))
    np.testing.assert_allclose(fp.logits(mapped, fp.PROMPTS[0]), fp.logits(model, fp.PROMPTS[0]), atol=2e-5, rtol=0)


@pytest.mark.parametrize(("weights", "corr"), [("q8_0", 0.995), ("q4_0", 0.8)])
def test_quantized_experts_run_their_own_modules(pair: fp.Pair, weights: str, corr: float) -> None:
    """Q8_0 / Q4_0 weights: every expert projection becomes a QuantizedLinear in the format llama.cpp gives its
    stack (the router stays float), and the logits follow the float model's (correlation; these random
    models' weights are wide, and 4 bits can route a token to other experts)."""
    d, _, model = pair
    q = from_pretrained(d, weights=weights)
    block = next(layer.mlp for layer in q.model.layers if isinstance(layer.mlp, Qwen3MoeSparseMoeBlock))
    projections = [p for m in block.experts for p in (m.gate_proj, m.up_proj, m.down_proj)]
    assert all(isinstance(p, QuantizedLinear) for p in projections)
    assert all(
        p.scheme == q.quantization_plan(weights)["model.layers.1.mlp.experts.0.up_proj"] for p in projections[1::3]
    )
    assert not isinstance(block.gate, QuantizedLinear)
    got, want = fp.logits(q, fp.PROMPTS[0]), fp.logits(model, fp.PROMPTS[0])
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > corr
    assert len(q.generate(fp.PROMPTS[1], 4)) == 4


@pytest.mark.parametrize("save_dtype", ["bfloat16", "float16"])
def test_half_checkpoints_load_to_the_same_float32_values(tmp_path: Path, save_dtype: str) -> None:
    """As fp.check_half_checkpoint, against the saved tensors (transformers' in-memory experts are fused)."""
    from safetensors.torch import load_file

    build(tmp_path, seed=2, save_dtype=getattr(torch, save_dtype), **SHAPES["tied-mqa-step2"])
    saved = load_file(tmp_path / "model.safetensors")
    model = from_pretrained(tmp_path)
    assert model.dtype is kael.float32
    for name, p in model.named_parameters():
        assert saved[name].dtype is getattr(torch, save_dtype)
        np.testing.assert_array_equal(p.detach().numpy(), saved[name].float().numpy(), err_msg=name)
    stored = from_pretrained(tmp_path, dtype="auto")
    assert stored.dtype is getattr(kael, save_dtype)
    assert len(stored.generate(fp.PROMPTS[1], 3)) == 3


def test_save_pretrained_is_read_by_transformers(tmp_path: Path, pair: fp.Pair) -> None:
    def check(config: dict[str, Any], hf: Any) -> None:
        assert config["num_experts"] == hf.config.num_experts
        assert config["mlp_only_layers"] == list(hf.config.mlp_only_layers)
        assert config["decoder_sparse_step"] == hf.config.decoder_sparse_step

    fp.check_save_pretrained(tmp_path, pair, "qwen3_moe", "Qwen3MoeForCausalLM", check)


def test_released_configs_num_experts_key_is_read(tmp_path: Path) -> None:
    """transformers 5 saves ``num_local_experts``, the released Qwen3-MoE configs ``num_experts``: both read."""
    d = _config(tmp_path)
    p = d / "config.json"
    cfg = json.loads(p.read_text())
    assert "num_local_experts" in cfg
    cfg["num_experts"] = cfg.pop("num_local_experts")
    p.write_text(json.dumps(cfg))
    assert read_config(d).num_experts == SHAPES["tied-mqa-step2"]["num_experts"]


def _config(tmp_path: Path, **changes: Any) -> Path:
    return fp.write_config(tmp_path, build, SHAPES["tied-mqa-step2"], **changes)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"num_experts_per_tok": 5}, "num_experts_per_tok 5 is more than num_experts 4"),
        ({"num_experts_per_tok": 0}, "num_experts_per_tok"),
        ({"moe_intermediate_size": None}, "moe_intermediate_size"),
        ({"decoder_sparse_step": 0}, "decoder_sparse_step"),
        ({"norm_topk_prob": "yes"}, "norm_topk_prob"),
        ({"mlp_only_layers": [1.5]}, "mlp_only_layers"),
        ({"num_experts": 5}, "num_experts 5 and num_local_experts 4 differ"),
        ({"use_sliding_window": True, "sliding_window": 0}, "sliding_window"),
        ({"attention_bias": 1}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)  # fmt: skip
def test_configs_qwen3_moe_cannot_run_are_refused_naming_the_field(
    tmp_path: Path, changes: dict[str, Any], match: str
) -> None:
    fp.check_refused(_config(tmp_path, **changes), match, "Qwen3-MoE config")


@pytest.mark.parametrize("key", ["num_local_experts", "num_experts_per_tok", "moe_intermediate_size"])
def test_missing_moe_fields_are_refused(tmp_path: Path, key: str) -> None:
    d = _config(tmp_path)
    p = d / "config.json"
    cfg = json.loads(p.read_text())
    del cfg[key]
    p.write_text(json.dumps(cfg))
    fp.check_refused(d, "missing key", "Qwen3-MoE config")


def test_missing_expert_weight_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    build(tmp_path, **SHAPES["tied-mqa-step2"])
    f = tmp_path / "model.safetensors"
    tensors = load_file(f)
    del tensors["model.layers.1.mlp.experts.2.down_proj.weight"]
    save_file(tensors, f, metadata={"format": "pt"})
    with pytest.raises(kael.FormatError, match=r"model\.layers\.1\.mlp\.experts\.2\.down_proj\.weight"):
        from_pretrained(tmp_path)


def test_no_gguf_layout_yet(pair: fp.Pair, tmp_path: Path) -> None:
    with pytest.raises(kael.KaelError):
        kael.models.save_gguf(pair[2], tmp_path / "m.gguf")


def test_config_class_checks() -> None:
    small = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                 head_dim=8, max_position_embeddings=16, moe_intermediate_size=8)  # fmt: skip
    with pytest.raises(kael.ShapeError, match="model_type"):
        Qwen3MoeConfig(model_type="qwen3")
    with pytest.raises(kael.ShapeError, match="num_experts_per_tok"):
        Qwen3MoeConfig(num_experts=2, num_experts_per_tok=3)
    with pytest.raises(kael.DTypeError, match="Qwen3MoeConfig"):
        Qwen3MoeForCausalLM(kael.models.Qwen3Config(hidden_size=32, num_attention_heads=2, num_hidden_layers=1))
    cfg = Qwen3MoeConfig(**small, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=2)  # type: ignore[arg-type]
    m = Qwen3MoeForCausalLM(cfg)
    assert _sparse(m) == [False, True]
    assert len(m.generate([1, 2, 3], 4)) == 4
    dense = Qwen3MoeForCausalLM(Qwen3MoeConfig(**small, num_experts=0))  # type: ignore[arg-type]
    assert _sparse(dense) == [False, False]
