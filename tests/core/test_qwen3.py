"""The Qwen3 family (kael/models/qwen3/ over kael/models/llama/): Hugging Face Qwen3 checkpoints that
transformers' ``Qwen3ForCausalLM`` writes offline with random weights load through
``kael.models.from_pretrained`` and compute transformers' logits, generate its greedy tokens, and decode
the same through the direct step (``LlamaDecodeStep`` with the per-head q/k norms), the KV cache and the
batched decoder with the paged cache.

Oracles: transformers' ``Qwen3ForCausalLM`` on the same weights (logits, greedy generate), the model's own
full forward pass (the direct step, cache, batched rows), each row alone (batched decoding, prefix cache).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kael
import numpy as np
import pytest
from kael import _dispatch
from kael.models import BatchDecoder, GenericStep, decode_step, families, from_pretrained, get_family
from kael.models.llama import LlamaDecodeStep
from kael.models.qwen3 import Qwen3Config, Qwen3ForCausalLM, read_config
from qwen3_checkpoints import SHAPES, build

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

PROMPTS = [[3, 17, 42, 99, 5, 150, 7, 8, 1, 0, 199], [12], [60, 61, 62, 63] * 5]


def hf_logits(hf: Any, ids: list[list[int]], mask: Any = None) -> np.ndarray:
    with torch.no_grad():
        out: np.ndarray = hf(torch.tensor(ids), attention_mask=mask).logits.numpy()
    return out


def logits(model: Any, ids: list[int]) -> np.ndarray:
    with kael.no_grad():
        out: np.ndarray = model(kael.tensor([ids])).numpy()[0].copy()
    return out


@pytest.fixture(scope="module", params=list(SHAPES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    """(checkpoint directory, transformers model, kael model) of one shape."""
    d = tmp_path_factory.mktemp(request.param)
    hf = build(d, seed=1, **SHAPES[request.param])
    model = from_pretrained(d)
    assert isinstance(model, Qwen3ForCausalLM)
    return d, hf, model


@pytest.fixture(params=["reference", "cpu"])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    kael.backends.use("cpu", request.param)
    try:
        yield request.param
    finally:
        kael.backends.use("cpu", None)


def test_registered_with_a_description() -> None:
    assert "qwen3" in families()
    fam = get_family("qwen3")
    assert "Qwen3" in fam.description and "q/k" in fam.description


def test_config_and_parameter_names(pair: tuple[Path, Any, Any]) -> None:
    d, hf, model = pair
    cfg = read_config(d)
    assert isinstance(cfg, Qwen3Config) and cfg.qk_norm and cfg.model_type == "qwen3"
    assert cfg.dim == hf.config.head_dim and cfg.tie_word_embeddings == hf.config.tie_word_embeddings
    assert cfg.qkv_bias == cfg.o_bias == hf.config.attention_bias and not cfg.mlp_bias
    want = {k: tuple(v.shape) for k, v in hf.state_dict().items()}
    if cfg.tie_word_embeddings:
        want.pop("lm_head.weight")
    assert {k: tuple(p.shape) for k, p in model.named_parameters()} == want
    assert model.model.layers[0].self_attn.q_norm.weight.shape == (cfg.dim,)


def test_logits_match_transformers(pair: tuple[Path, Any, Any], backend: str) -> None:
    _, hf, model = pair
    for ids in PROMPTS:
        np.testing.assert_allclose(logits(model, ids), hf_logits(hf, [ids])[0], atol=1e-4, rtol=0)


def test_right_padded_batch_matches_transformers(pair: tuple[Path, Any, Any]) -> None:
    _, hf, model = pair
    t = max(len(p) for p in PROMPTS)
    ids = [p + [0] * (t - len(p)) for p in PROMPTS]
    mask = torch.tensor([[1] * len(p) + [0] * (t - len(p)) for p in PROMPTS])
    with kael.no_grad():
        got = model(kael.tensor(ids), lengths=[len(p) for p in PROMPTS]).numpy()
    want = hf_logits(hf, ids, mask)
    for i, p in enumerate(PROMPTS):
        np.testing.assert_allclose(got[i, : len(p)], want[i, : len(p)], atol=1e-4, rtol=0)


def test_incremental_cache_equals_the_full_pass(pair: tuple[Path, Any, Any]) -> None:
    _, hf, model = pair
    ids = PROMPTS[0] + PROMPTS[2]
    cache = model.new_cache()
    with kael.no_grad():
        steps = [model(kael.tensor([ids[:5]]), cache).numpy()[0]]
        steps += [model(kael.tensor([[t]]), cache).numpy()[0] for t in ids[5:]]
    np.testing.assert_allclose(np.concatenate(steps), hf_logits(hf, [ids])[0], atol=1e-4, rtol=0)


def test_greedy_generate_matches_transformers(pair: tuple[Path, Any, Any]) -> None:
    _, hf, model = pair
    for ids in PROMPTS[:2]:
        with torch.no_grad():
            x = torch.tensor([ids])  # the mask given: transformers would mask the prompt's pad-id tokens
            want = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=24, do_sample=False, pad_token_id=0)
        assert model.generate(ids, 24) == want[0, len(ids) :].tolist()


@pytest.mark.parametrize("direct", [True, False])
def test_decode_step_equals_the_general_forward_pass(pair: tuple[Path, Any, Any], backend: str, direct: bool) -> None:
    """LlamaDecodeStep applies q_norm / k_norm per head with the rms_norm kernel (fused or separate q/k/v)."""
    _, _, model = pair
    if direct and any(_dispatch.fused_kernel("cpu", op) is None for op in ("rms_norm", "rope", "silu_mul")):
        pytest.fail(f"the {backend!r} backend lacks rms_norm/rope/silu_mul kernels: no direct step to test")
    ids = [(7 * i + 3) % 200 for i in range(24)]
    for mapped in (False, True):  # a mapped load keeps q/k/v apart: the step's separate products
        m = Qwen3ForCausalLM.from_pretrained(pair[0], mmap=mapped) if mapped else model
        cache = m.new_cache(max_positions=24)
        with kael.no_grad():
            m(kael.tensor([ids[:8]]), cache)
            step = decode_step(m, cache, direct)
            assert isinstance(step, LlamaDecodeStep) == direct and isinstance(step, GenericStep) != direct
            if direct:
                assert all(lay.q_norm is not None and (lay.qkv is None) == mapped for lay in step.layers)
            rows = []
            for t in ids[8:]:
                rows.append(step([0], [t]).numpy()[0].copy())
                cache.lengths[0] += 1
        np.testing.assert_allclose(np.stack(rows), logits(m, ids)[8:], atol=2e-5, rtol=0)


def test_quantized_decode_step_equals_its_forward_pass(pair: tuple[Path, Any, Any]) -> None:
    """Q8_0 weights (quantized_linear kernels, fused q/k/v blocks): the direct step with the q/k norms still
    equals the model's own forward pass, and greedy generate runs it."""
    model = from_pretrained(pair[0], weights="q8_0")
    ids = [(11 * i + 5) % 200 for i in range(16)]
    cache = model.new_cache(max_positions=16)
    with kael.no_grad():
        model(kael.tensor([ids[:6]]), cache)
        step = decode_step(model, cache)
        assert isinstance(step, LlamaDecodeStep) and all(lay.q_norm is not None for lay in step.layers)
        rows = []
        for t in ids[6:]:
            rows.append(step([0], [t]).numpy()[0].copy())
            cache.lengths[0] += 1
    np.testing.assert_allclose(np.stack(rows), logits(model, ids)[6:], atol=2e-5, rtol=0)


def test_batched_rows_equal_each_alone(pair: tuple[Path, Any, Any], backend: str) -> None:
    """BatchDecoder (paged cache, one block per row) rows of different lengths, joining late, equal each alone."""
    _, _, model = pair
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(0, 200, size=k)] for k in (1, 7, 12, 3)]
    alone = [model.generate(p, 12) for p in prompts]
    engine = BatchDecoder(model, rows=4)
    firsts = engine.prefill_many([0, 1, 2, 3], prompts)
    out = [[t] for t in engine.greedy(firsts)]
    for _ in range(11):
        nxt = engine.greedy(engine.decode([0, 1, 2, 3], [o[-1] for o in out]))
        for o, t in zip(out, nxt):
            o.append(t)
    assert out == alone


def test_prefix_cache_hits_give_each_row_its_tokens_alone(pair: tuple[Path, Any, Any]) -> None:
    """The paged cache with prefix caching: prompts sharing whole cached blocks reuse them (only the suffix
    runs), the hit's first logits equal a cold prefill's, and the rows decoded together give the tokens of
    each alone (generate)."""
    _, _, model = pair
    shared = [(5 * i + 2) % 200 for i in range(20)]
    prompts = [shared + [7, 8], shared + [9], shared[:17] + [11, 12, 13]]
    alone = [model.generate(p, 8) for p in prompts]
    warm = BatchDecoder(model, 3, block_size=8)
    cold = BatchDecoder(model, 1, prefix_caching=False)
    out = []
    for row, p in enumerate(prompts):
        first = warm.prefill(row, p)
        assert warm.cached_tokens(row) == (0 if row == 0 else 16)  # two whole blocks of 8 shared
        np.testing.assert_allclose(first.numpy(), cold.prefill(0, p).numpy(), rtol=0, atol=1e-5)
        cold.release(0)
        out.append(warm.greedy(kael.reshape(first, 1, model.vocab_size)))
    assert warm.kv_stats()["prefix_hit_tokens"] == 32
    for _ in range(7):
        nxt = warm.greedy(warm.decode([0, 1, 2], [o[-1] for o in out]))
        for o, t in zip(out, nxt):
            o.append(t)
    assert out == alone


@pytest.mark.parametrize("save_dtype", ["bfloat16", "float16"])
def test_half_checkpoints_load_to_the_same_float32_values(tmp_path: Path, save_dtype: str) -> None:
    hf = build(tmp_path, seed=2, save_dtype=getattr(torch, save_dtype), **SHAPES["tied-hd24"])
    model = from_pretrained(tmp_path)
    assert model.dtype is kael.float32
    for name, p in model.named_parameters():
        want = hf.state_dict()[name].to(getattr(torch, save_dtype)).float().numpy()
        np.testing.assert_array_equal(p.detach().numpy(), want, err_msg=name)
    stored = from_pretrained(tmp_path, dtype="auto")
    assert stored.dtype is getattr(kael, save_dtype)


def test_save_pretrained_is_read_by_transformers(tmp_path: Path, pair: tuple[Path, Any, Any]) -> None:
    import transformers

    _, hf, model = pair
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(back).__name__ == "Qwen3ForCausalLM"
    np.testing.assert_allclose(hf_logits(back, [PROMPTS[0]]), hf_logits(hf, [PROMPTS[0]]), atol=1e-6, rtol=0)
    np.testing.assert_array_equal(logits(from_pretrained(tmp_path), PROMPTS[0]), logits(model, PROMPTS[0]))


def _config(tmp_path: Path, **changes: Any) -> Path:
    build(tmp_path, **SHAPES["tied-hd24"])
    p = tmp_path / "config.json"
    d = json.loads(p.read_text())
    d.update(changes)
    p.write_text(json.dumps(d))
    return tmp_path


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0, "layer_types": None},
         "sliding_window 16"),
        ({"use_sliding_window": True, "sliding_window": 16, "layer_types": ["full_attention", "sliding_attention"]},
         "use_sliding_window"),
        ({"use_sliding_window": "yes"}, "use_sliding_window"),
        ({"attention_bias": 1}, "attention_bias"),
        ({"head_dim": 15}, "head_dim"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)  # fmt: skip
def test_configs_qwen3_cannot_run_are_refused_naming_the_field(
    tmp_path: Path, changes: dict[str, Any], match: str
) -> None:
    with pytest.raises(kael.FormatError, match=match) as err:
        from_pretrained(_config(tmp_path, **changes))
    assert "Qwen3 config" in str(err.value) and "config.json" in str(err.value)


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
