"""The Phi-3 family (kael/models/phi3/ over kael/models/llama/): Hugging Face Phi-3 checkpoints that
transformers' ``Phi3ForCausalLM`` writes offline with random weights (fused ``qkv_proj`` / ``gate_up_proj``,
GQA and multi-query, tied and untied, with and without longrope, Phi-4-mini's partial rotary) load through
``kael.models.from_pretrained`` and compute transformers' logits, generate its greedy tokens (its generate's, or
where a short prompt's continuation crosses longrope's ``original_max_position_embeddings``, those of its KV cache
fed token by token: transformers' generate recomputes the cache there, kael does not), and decode the same through the direct step (``Phi3DecodeStep`` over the
fused weights, float and Q8_0), the KV cache and the batched decoder with the paged cache.

Oracles: transformers' ``Phi3ForCausalLM`` on the same weights (logits, greedy generate, its own KV cache fed
token by token: with longrope that is not its full pass, NOTE [longrope factors] in kael/models/phi3/_rope.py),
the model's own forward passes over the cache (the direct step), each row alone (batched decoding, prefix cache).
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
from kael.models.phi3 import LongRope, Phi3Config, Phi3DecodeStep, Phi3ForCausalLM, read_config
from phi3_checkpoints import ORIGINAL, SHAPES, build, longrope

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pair = fp.pair_fixture(SHAPES, build, Phi3ForCausalLM)


def _fused(step: Any, model: Any) -> None:
    """The step's layers run the checkpoint's fused weights themselves (no copy)."""
    for lay, blk in zip(step.layers, model.model.layers):
        assert lay.qkv is not None and lay.gate_up is not None
        assert lay.qkv.weight is blk.self_attn.qkv_proj.weight and lay.gate_up.weight is blk.mlp.gate_up_proj.weight


def _hf_incremental(hf: Any, ids: list[int], prefill: int) -> np.ndarray:
    """transformers' logits of ``ids`` over its KV cache: ``ids[:prefill]`` in one pass, then one token a pass."""
    from transformers import DynamicCache

    cache = DynamicCache(config=hf.config)
    out = []
    with torch.no_grad():
        for a, b in [(0, prefill), *[(i, i + 1) for i in range(prefill, len(ids))]]:
            out.append(hf(torch.tensor([ids[a:b]]), past_key_values=cache, use_cache=True).logits.numpy()[0])
    return np.concatenate(out)


def _incremental(model: Any, ids: list[int], prefill: int) -> np.ndarray:
    """kael's logits of ``ids`` over a KV cache, ``ids[:prefill]`` in one pass, then one token a pass."""
    cache = model.new_cache()
    with kael.no_grad():
        steps = [model(kael.tensor([ids[:prefill]]), cache).numpy()[0]]
        steps += [model(kael.tensor([[t]]), cache).numpy()[0] for t in ids[prefill:]]
    return np.concatenate(steps)


def test_registered_with_a_description() -> None:
    fp.check_registered("phi3", "Phi-3", "Phi-4-mini", "longrope")


def test_config_and_parameter_names(pair: fp.Pair) -> None:
    d, hf, model = pair
    cfg = read_config(d)
    assert isinstance(cfg, Phi3Config) and cfg.model_type == "phi3"
    assert cfg.tie_word_embeddings == hf.config.tie_word_embeddings and cfg.kv_heads == hf.config.num_key_value_heads
    rp = hf.config.rope_parameters
    assert cfg.partial_rotary_factor == rp["partial_rotary_factor"]
    if rp["rope_type"] == "longrope":
        assert cfg.longrope is not None and cfg.longrope.original_max_position_embeddings == ORIGINAL
        assert (
            list(cfg.longrope.short_factor) == rp["short_factor"]
            and list(cfg.longrope.long_factor) == rp["long_factor"]
        )
    else:
        assert cfg.longrope is None
    fp.check_parameter_names(cfg, hf, model)
    h, kv, dim = cfg.num_attention_heads, cfg.kv_heads, cfg.dim
    assert model.model.layers[0].self_attn.qkv_proj.weight.shape == ((h + 2 * kv) * dim, cfg.hidden_size)


def test_logits_match_transformers(pair: fp.Pair, backend: str) -> None:
    """PROMPTS[2] (20 tokens) is past the longrope shapes' original 16: one pass with the long factors."""
    fp.check_logits(pair)


def test_right_padded_batch_matches_transformers(pair: fp.Pair) -> None:
    fp.check_right_padded_batch(pair)


def test_kv_cache_matches_transformers_cache(pair: fp.Pair) -> None:
    """Prefill 5 tokens, then one a pass up to 31: transformers' cache gives the same logits (with longrope the
    short keys stay cached and the passes from position 16 on rotate with the long factors)."""
    _, hf, model = pair
    ids = fp.PROMPTS[0] + fp.PROMPTS[2]
    np.testing.assert_allclose(_incremental(model, ids, 5), _hf_incremental(hf, ids, 5), atol=1e-4, rtol=0)


def test_incremental_cache_equals_the_full_pass_without_longrope(pair: fp.Pair) -> None:
    if pair[2].config.longrope is not None:
        pytest.skip("longrope: a pass's factors depend on its last position (NOTE [longrope factors])")
    fp.check_incremental_cache(pair)


def test_longrope_factors_switch_at_the_original_length(pair: fp.Pair) -> None:
    """A pass ending at the original length uses the short factors (the same logits as the same tokens in a longer
    cached run); one pass past it uses the long ones everywhere, which changes even its first positions."""
    _, _, model = pair
    if model.config.longrope is None:
        pytest.skip("no longrope")
    ids = fp.PROMPTS[2]
    short, full = fp.logits(model, ids[:ORIGINAL]), fp.logits(model, ids)
    np.testing.assert_array_equal(short, _incremental(model, ids, ORIGINAL)[:ORIGINAL])
    assert np.abs(short - full[:ORIGINAL]).max() > 1e-3


def _hf_cached_greedy(hf: Any, ids: list[int], new: int) -> list[int]:
    """transformers' greedy tokens over its KV cache fed by hand (the prompt in one pass, then a token a pass)."""
    from transformers import DynamicCache

    cache, out = DynamicCache(config=hf.config), []
    with torch.no_grad():
        logits = hf(torch.tensor([ids]), past_key_values=cache, use_cache=True).logits[0, -1]
        for _ in range(new):
            out.append(int(logits.argmax()))
            logits = hf(torch.tensor([out[-1:]]), past_key_values=cache, use_cache=True).logits[0, -1]
    return out


def test_greedy_generate_matches_transformers(pair: fp.Pair) -> None:
    """Without longrope: transformers' generate. With it, transformers' generate drops its cache and recomputes
    the whole sequence with the long factors when the sequence first passes the original length (Phi-3's
    prepare_inputs_for_generation); kael keeps the short keys (NOTE [longrope factors]), so kael's generate is
    transformers' on a prompt already past the original 16 (PROMPTS[2], 20 tokens) and its cache fed by hand
    on prompts that cross it while decoding (11 or 1 token + 24)."""
    _, hf, model = pair
    if model.config.longrope is None:
        fp.check_greedy_generate(pair)
        return
    assert model.generate(fp.PROMPTS[2], 24) == fp.hf_greedy(hf, fp.PROMPTS[2], 24)
    for ids in fp.PROMPTS[:2]:
        assert model.generate(ids, 24) == _hf_cached_greedy(hf, ids, 24)


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("mapped", [False, True])
def test_decode_step_equals_the_cached_forward_pass(pair: fp.Pair, backend: str, mapped: bool, direct: bool) -> None:
    """The direct step (the fused weights, float, copied or mapped; with partial rotary, rope on views of the first
    rotary dims and copy of the rest) and the generic one equal the model's forward over the cache, token by token
    past the original length."""
    d, _, model = pair
    m = Phi3ForCausalLM.from_pretrained(d, mmap=True) if mapped else model
    ids = [(7 * i + 3) % 200 for i in range(24)]
    rows = fp._step_rows(m, ids, 8, direct, Phi3DecodeStep, _fused)
    np.testing.assert_allclose(rows, _incremental(m, ids, 8)[8:], atol=2e-5, rtol=0)


def test_quantized_decode_step_equals_its_forward_pass(pair: fp.Pair) -> None:
    """Q8_0 weights: qkv_proj and gate_up_proj are one QuantizedLinear each, which the direct step runs."""

    def check(step: Any, model: Any) -> None:
        assert all(lay.qkv is not None and lay.qkv.scheme == "q8_0" for lay in step.layers)
        assert type(model.model.layers[0].self_attn.qkv_proj).__name__ == "QuantizedLinear"

    fp.check_quantized_decode_step(pair, Phi3DecodeStep, check)


def test_batched_rows_equal_each_alone(pair: fp.Pair, backend: str) -> None:
    fp.check_batched_rows(pair)


def test_tokens_at_positions_equal_one_step_at_a_time(pair: fp.Pair) -> None:
    fp.check_decode_entries(pair)


def test_prefix_cache_hits_give_each_row_its_tokens_alone(pair: fp.Pair) -> None:
    """The 20-token shared prefix crosses longrope's original 16: every pass over it (the first prompt's, the
    cold prefills) uses the long factors, and the hits' suffixes too. atol 2e-5: a hit's attention over the
    cached blocks rounds differently from one pass (max |logit| ~ 5 here; measured 1.0e-5)."""
    fp.check_prefix_cache(pair, hit_tokens=32, atol=2e-5)


@pytest.mark.parametrize("save_dtype", ["bfloat16", "float16"])
def test_half_checkpoints_load_to_the_same_float32_values(tmp_path: Path, save_dtype: str) -> None:
    fp.check_half_checkpoint(tmp_path, save_dtype, build, SHAPES["partial-longrope"])


def test_save_pretrained_is_read_by_transformers(tmp_path: Path, pair: fp.Pair) -> None:
    def same_rope(config: dict[str, Any], hf: Any) -> None:
        rp = hf.config.rope_parameters
        assert {k: config["rope_parameters"].get(k) for k in rp} == rp
        assert config["original_max_position_embeddings"] == hf.config.original_max_position_embeddings

    fp.check_save_pretrained(tmp_path, pair, "phi3", "Phi3ForCausalLM", same_rope)


def test_older_rope_scaling_names_read_as_longrope(tmp_path: Path) -> None:
    """Phi-3's older configs: ``rope_scaling`` with type "su" or "yarn" is transformers' longrope."""
    shape = SHAPES["mqa-tied-longrope"]
    want = fp.logits(from_pretrained(build(tmp_path, seed=5, **shape) and tmp_path), fp.PROMPTS[2])
    for kind in ("su", "yarn"):
        scaling = {k: v for k, v in shape["rope_parameters"].items() if k != "rope_type"}
        p = tmp_path / "config.json"
        d = json.loads(p.read_text())
        d.pop("rope_parameters", None)
        d.update(rope_scaling={**scaling, "type": kind}, rope_theta=10000.0)
        p.write_text(json.dumps(d))
        m = from_pretrained(tmp_path)
        assert m.config.longrope is not None
        np.testing.assert_array_equal(fp.logits(m, fp.PROMPTS[2]), want)


def _config(tmp_path: Path, **changes: Any) -> Path:
    return fp.write_config(tmp_path, build, SHAPES["mqa-tied-longrope"], **changes)


_ROPE = SHAPES["mqa-tied-longrope"]["rope_parameters"]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"rope_parameters": {**_ROPE, "rope_type": "llama3"}}, "rope type 'llama3'"),
        ({"rope_parameters": {**_ROPE, "short_factor": [1.0] * 3}}, "short_factor must have 8"),
        ({"rope_parameters": {**_ROPE, "long_factor": None}}, "long_factor"),
        ({"rope_parameters": {**_ROPE, "long_factor": [1.0, "x"] * 4}}, "long_factor"),
        ({"rope_parameters": {**_ROPE, "attention_factor": -1}}, "attention_factor"),
        ({"rope_parameters": "longrope"}, "rope_parameters must be an object"),
        ({"partial_rotary_factor": 1.5, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
         "partial_rotary_factor"),
        ({"original_max_position_embeddings": 0}, "original_max_position_embeddings"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"sliding_window": "x"}, "sliding_window"),
        ({"head_dim": 8}, "head_dim"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"model_type": "phi"}, "model_type"),
    ],
)  # fmt: skip
def test_configs_phi3_cannot_run_are_refused_naming_the_field(
    tmp_path: Path, changes: dict[str, Any], match: str
) -> None:
    d = _config(tmp_path, **changes)
    if changes.get("model_type") == "phi":
        with pytest.raises(kael.FormatError, match=match):
            read_config(d)
        return
    fp.check_refused(d, match, "Phi3 config")


def test_a_window_covering_the_context_is_accepted(tmp_path: Path) -> None:
    """Phi-3.5-mini's and Phi-4-mini's sliding_window (262144) covers their context: full attention; a shorter one
    is every layer's window (parity with transformers: tests/core/test_sliding_window_families.py)."""
    m = from_pretrained(_config(tmp_path, sliding_window=96))
    assert m.config.sliding_window == 96 and m.config.layer_windows == ()
    m = from_pretrained(_config(tmp_path, sliding_window=47))
    assert m.config.layer_windows == (47,) * m.config.num_hidden_layers
    assert all(blk.self_attn.window == 47 for blk in m.model.layers)


def test_missing_fused_projection_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    build(tmp_path, **SHAPES["gqa-untied-default"])
    f = tmp_path / "model.safetensors"
    tensors = load_file(f)
    del tensors["model.layers.1.mlp.gate_up_proj.weight"]
    save_file(tensors, f, metadata={"format": "pt"})
    with pytest.raises(kael.FormatError, match=r"model\.layers\.1\.mlp\.gate_up_proj\.weight"):
        from_pretrained(tmp_path)


def test_config_class_checks() -> None:
    small = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                 max_position_embeddings=32)  # fmt: skip
    with pytest.raises(kael.ShapeError, match="model_type"):
        Phi3Config(**small, model_type="llama")
    with pytest.raises(kael.DTypeError, match="Phi3Config"):
        Phi3ForCausalLM(kael.models.LlamaConfig(**small))
    with pytest.raises(kael.ShapeError, match="partial_rotary_factor"):
        Phi3Config(**small, partial_rotary_factor=0)
    with pytest.raises(kael.ShapeError, match="short_factor"):
        Phi3Config(**small, longrope=LongRope((1.0,) * 3, (1.0,) * 8, 8))
    with pytest.raises(kael.ShapeError, match="sliding_window"):
        Phi3Config(**small, sliding_window=0)
    assert Phi3Config(**small, sliding_window=8).layer_windows == (8,)
    lr = longrope(16)
    cfg = Phi3Config(**small, longrope=LongRope(tuple(lr["short_factor"]), tuple(lr["long_factor"]), 8))
    assert cfg.attention_scale == pytest.approx((1 + np.log(4) / np.log(8)) ** 0.5)
    m = Phi3ForCausalLM(cfg)
    assert len(m.generate([1, 2, 3], 12)) == 12  # crosses the original 8


_PHI4_MINI = {  # Phi-4-mini-instruct's config.json fields kael reads (factor lists shortened to constants)
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
    "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 200064,
    "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "partial_rotary_factor": 0.75,
    "rope_scaling": {"type": "longrope", "long_factor": [1.5] * 48, "short_factor": [1.0] * 48},
    "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
    "bos_token_id": 199999, "eos_token_id": 199999, "pad_token_id": 199999, "hidden_act": "silu",
}  # fmt: skip


def test_released_configs_read_as_transformers_reads_them(tmp_path: Path) -> None:
    """Phi-4-mini's shape (partial rotary 96 of 128 dims, longrope of 48 factors, the attention factor transformers
    computes from 131072 / 4096); Phi-3-mini-4k's sliding_window 2047 < 4096 is every layer's window."""
    import transformers

    p = tmp_path / "config.json"
    p.write_text(json.dumps(_PHI4_MINI))
    cfg = read_config(tmp_path)
    hf = transformers.Phi3Config(**{k: v for k, v in _PHI4_MINI.items() if k not in ("architectures", "model_type")})
    assert cfg.rotary_dim == int(hf.hidden_size // hf.num_attention_heads * hf.rope_parameters["partial_rotary_factor"])
    assert cfg.longrope is not None and cfg.longrope.original_max_position_embeddings == 4096
    assert cfg.attention_scale == pytest.approx((1 + np.log(32) / np.log(4096)) ** 0.5)
    mini_4k = {**_PHI4_MINI, "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
               "sliding_window": 2047, "rope_scaling": None, "partial_rotary_factor": 1.0}  # fmt: skip
    p.write_text(json.dumps(mini_4k))
    assert read_config(tmp_path).layer_windows == (2047,) * 32
