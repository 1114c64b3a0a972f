"""The Llama family's config, rotary tables and checkpoints (kael/models/llama/): config.json as
transformers 4.x and 5.x write it for llama, qwen2 and mistral, every bad field a FormatError
naming config.json and the field, inverse frequencies against transformers' ROPE_INIT_FUNCTIONS,
strict loading (missing, unexpected, misshapen tensors), save_pretrained read back by transformers,
the registry and generation_config.

Oracles: transformers (its configs, rope functions and models on random weights built offline).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import kael
import numpy as np
import pytest
from kael.models import LlamaConfig, LlamaForCausalLM, from_pretrained, model_type_of
from kael.models.llama import attention_scaling, inverse_frequencies, read_config, rope_tables
from kael.models.llama._config import RopeScaling
from llama_checkpoints import build, hf_config

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def _write(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _saved_config(tmp_path: Path, family: str, **overrides: Any) -> dict[str, Any]:
    hf_config(family, **overrides).save_pretrained(tmp_path)
    d: dict[str, Any] = json.loads((tmp_path / "config.json").read_text())
    return d


# -- config.json ----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_config_as_transformers_writes_it(tmp_path: Path, family: str) -> None:
    hf = hf_config(family, num_key_value_heads=1, tie_word_embeddings=family == "qwen2", rope_theta=5e5)
    hf.save_pretrained(tmp_path)
    c = read_config(tmp_path)
    assert c.model_type == family
    assert (c.vocab_size, c.hidden_size, c.intermediate_size) == (320, 64, 128)
    assert (c.num_hidden_layers, c.num_attention_heads, c.kv_heads, c.dim) == (2, 4, 1, 16)
    assert c.max_position_embeddings == 128 and c.rms_norm_eps == 1e-6
    assert c.rope_theta == 5e5 and c.rope_scaling.rope_type == "default"
    assert c.tie_word_embeddings is (family == "qwen2")
    assert (c.qkv_bias, c.o_bias, c.mlp_bias) == ((True, False, False) if family == "qwen2" else (False,) * 3)


def test_config_head_dim_bias_and_eos_list(tmp_path: Path) -> None:
    d = _saved_config(tmp_path, "llama", head_dim=24, attention_bias=True, mlp_bias=True, eos_token_id=[2, 7])
    c = read_config(_write(tmp_path, d))
    assert c.dim == 24 and c.hidden_size == 64
    assert (c.qkv_bias, c.o_bias, c.mlp_bias) == (True, True, True)
    assert c.eos_token_id == (2, 7) and c.eos_ids == (2, 7) and c.bos_token_id == 1


@pytest.mark.parametrize(
    ("scaling", "want"),
    [
        ({"rope_type": "linear", "factor": 2.0}, ("linear", {"factor": 2.0})),
        ({"type": "dynamic", "factor": 4.0}, ("dynamic", {"factor": 4.0})),
        (
            {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
            ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
        ),
    ],
)
def test_transformers_4_rope_layout(tmp_path: Path, scaling: dict[str, Any], want: tuple[str, dict[str, Any]]) -> None:
    # transformers 4.x: rope_theta at the top level, rope_scaling beside it (with "type" in older files)
    d = {**_saved_config(tmp_path, "llama"), "rope_theta": 1234.0, "rope_scaling": scaling}
    del d["rope_parameters"]
    c = read_config(_write(tmp_path, d))
    assert c.rope_theta == 1234.0 and c.rope_scaling.rope_type == want[0]
    for k, v in want[1].items():
        assert c.rope_scaling.get(k) == v
    if want[0] == "llama3":  # the context stands in for original_max_position_embeddings, as in transformers
        assert c.rope_scaling.get("original_max_position_embeddings") == 128


def test_transformers_5_rope_parameters(tmp_path: Path) -> None:
    rp = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    d = _saved_config(tmp_path, "llama", rope_parameters=rp)
    assert d["rope_parameters"]["rope_type"] == "llama3" and "rope_scaling" not in d  # how 5.x writes it
    c = read_config(tmp_path)
    assert c.rope_theta == 500000.0
    assert c.rope_scaling == RopeScaling(
        "llama3", {k: v for k, v in rp.items() if k not in ("rope_type", "rope_theta")}
    )


def test_sliding_window_covering_the_context_is_accepted(tmp_path: Path) -> None:
    for w in (None, 128, 4096):
        assert (
            read_config(_write(tmp_path, _saved_config(tmp_path, "mistral", sliding_window=w))).model_type == "mistral"
        )
    # qwen2's sliding_window only applies with use_sliding_window
    assert read_config(_write(tmp_path, _saved_config(tmp_path, "qwen2", sliding_window=16))).model_type == "qwen2"


@pytest.mark.parametrize(
    ("family", "change", "field", "detail"),
    [
        ("llama", {"sliding_window": 64}, "sliding_window", "Llama has no sliding-window attention"),
        ("mistral", {"sliding_window": 0}, "sliding_window", "positive integer or null"),
        (
            "qwen2",
            {"use_sliding_window": True, "sliding_window": 8, "layer_types": ["sliding_attention"]},
            "layer_types",
            "list of",
        ),
        ("llama", {"hidden_size": 0}, "hidden_size", "positive integer"),
        ("llama", {"vocab_size": "320"}, "vocab_size", "positive integer"),
        ("llama", {"num_hidden_layers": True}, "num_hidden_layers", "positive integer"),
        ("llama", {"num_key_value_heads": 3}, "num_key_value_heads", "not a multiple"),
        ("llama", {"head_dim": 15}, "head_dim", "even"),
        ("llama", {"head_dim": None, "num_attention_heads": 3, "num_key_value_heads": 3}, "head_dim", "divisible"),
        ("llama", {"rms_norm_eps": -1}, "rms_norm_eps", "(0, 1)"),
        ("llama", {"hidden_act": "gelu"}, "hidden_act", "not supported"),
        ("llama", {"tie_word_embeddings": "yes"}, "tie_word_embeddings", "true or false"),
        ("llama", {"eos_token_id": [2, -1]}, "eos_token_id", "non-negative"),
        ("llama", {"bos_token_id": 1.5}, "bos_token_id", "non-negative"),
        ("llama", {"model_type": "gpt2"}, "model_type", "expected one of"),
        ("llama", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "longrope", "not supported"),
        ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, "factor", "needs"),
        ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 0, "rope_theta": 1e4}}, "factor", "> 0"),
        ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 0.5}}, "rope_theta", "> 1"),
        ("llama", {"rope_parameters": "default"}, "rope_parameters", "object"),
        ("llama", {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, "partial", "1.0"),
        (
            "llama",
            {"rope_parameters": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 1}},
            "high_freq_factor",
            "!=",
        ),
    ],
)
def test_bad_config_is_a_format_error_naming_the_field(
    tmp_path: Path, family: str, change: dict[str, Any], field: str, detail: str
) -> None:
    d = {**_saved_config(tmp_path, family), **change}
    _write(tmp_path, d)
    with pytest.raises(kael.FormatError, match="config.json") as err:
        read_config(tmp_path)
    assert field in str(err.value) and detail in str(err.value)
    with pytest.raises(kael.FormatError):  # the loader too, before reading any weight
        LlamaForCausalLM.from_pretrained(tmp_path)


def test_missing_fields_and_files(tmp_path: Path) -> None:
    d = _saved_config(tmp_path, "llama")
    del d["intermediate_size"]
    with pytest.raises(kael.FormatError, match="missing key 'intermediate_size'"):
        read_config(_write(tmp_path, d))
    with pytest.raises(kael.FormatError, match="cannot read"):
        read_config(tmp_path / "nowhere")
    with pytest.raises(kael.FormatError, match="not a directory"):
        LlamaForCausalLM.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(kael.FormatError, match="JSON"):
        read_config(tmp_path)


def test_config_defaults_and_checks() -> None:
    c = LlamaConfig(vocab_size=10, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
    assert (c.kv_heads, c.dim, c.eos_ids) == (4, 8, ())
    with pytest.raises(kael.ShapeError, match="num_key_value_heads 3"):
        LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=3)
    with pytest.raises(kael.ShapeError, match="rope type 'nope'"):
        LlamaConfig(rope_scaling=RopeScaling("nope"))


# -- rotary tables ----------------------------------------------------------------------------------


ROPES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    "yarn_mscale": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32,
        "mscale": 1.0,
        "mscale_all_dim": 0.5,
        "beta_fast": 16,
        "beta_slow": 2,
    },
}


@pytest.mark.parametrize("name", list(ROPES))
@pytest.mark.parametrize("head_dim", [16, 64])
def test_inverse_frequencies_match_transformers(tmp_path: Path, name: str, head_dim: int) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = hf_config("llama", head_dim=head_dim, rope_parameters={**ROPES[name], "rope_theta": 10000.0})
    hf.save_pretrained(tmp_path)
    c = read_config(tmp_path)
    kind = ROPES[name]["rope_type"]
    if kind == "default":
        want = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        scale = 1.0
    else:
        want, scale = ROPE_INIT_FUNCTIONS[kind](hf, "cpu")
    got = inverse_frequencies(c)
    assert got.shape == (head_dim // 2,) and got.dtype == np.float64
    np.testing.assert_allclose(got, want.double().numpy(), rtol=2e-6, atol=0)
    assert math.isclose(attention_scaling(c), scale, rel_tol=1e-12)
    # the tables are transformers' cos/sin (LlamaRotaryEmbedding) at every position of the context
    rot = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(hf)
    x = torch.zeros(1, 1, head_dim)
    hcos, hsin = rot(x, torch.arange(128)[None])
    cos, sin = rope_tables(c, 128)
    assert cos.shape == sin.shape == (128, head_dim // 2) and cos.dtype == np.float32
    np.testing.assert_allclose(cos, hcos[0, :, : head_dim // 2].numpy(), atol=2e-5, rtol=0)
    np.testing.assert_allclose(sin, hsin[0, :, head_dim // 2 :].numpy(), atol=2e-5, rtol=0)
    cos64, _ = rope_tables(c, 128, np.float64)
    assert cos64.dtype == np.float64
    np.testing.assert_allclose(cos64, np.cos(np.arange(128)[:, None] * got[None]) * scale, atol=1e-12)


# -- checkpoints ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    d = tmp_path_factory.mktemp("llama")
    hf = build(d, "llama", eos_token_id=[2, 5])
    return d, hf


def test_parameter_names_are_the_checkpoint_keys(saved: tuple[Path, Any]) -> None:
    d, hf = saved
    m = LlamaForCausalLM.from_pretrained(d)
    names = {n for n, _ in m.named_parameters()}
    assert names == set(hf.state_dict()) == set(m.state_dict())
    p = dict(m.named_parameters())
    assert p["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)  # [Hkv * D, C], nn.Linear's layout
    assert p["model.layers.0.mlp.down_proj.weight"].shape == (64, 128)
    for name, t in hf.state_dict().items():
        np.testing.assert_array_equal(p[name].detach().numpy(), t.numpy())


def test_loaded_through_the_registry_with_generation_config(saved: tuple[Path, Any]) -> None:
    d, _ = saved
    assert model_type_of(d) == "llama"
    m = from_pretrained(d)
    assert isinstance(m, LlamaForCausalLM) and not m.training
    assert m.generation_config.eos_token_ids == (2, 5)  # from the generation_config.json transformers wrote
    assert (m.vocab_size, m.max_positions, m.num_layers, m.num_kv_heads, m.head_dim) == (320, 128, 2, 2, 16)
    cache = m.new_cache(2)
    assert (cache.layers, cache.heads, cache.head_dim, cache.max_positions) == (2, 2, 16, 128)  # Hkv heads only


def _tensors(d: Path) -> dict[str, kael.Tensor]:
    return dict(kael.load_safetensors(d / "model.safetensors"))


def test_missing_unexpected_and_misshapen_tensors_are_named(tmp_path: Path, saved: tuple[Path, Any]) -> None:
    d, _ = saved
    tensors = _tensors(d)
    config = json.loads((d / "config.json").read_text())

    def attempt(ts: dict[str, kael.Tensor], cfg: dict[str, Any] = config) -> str:
        _write(tmp_path, cfg)
        kael.save_safetensors(ts, tmp_path / "model.safetensors")
        with pytest.raises(kael.FormatError) as err:
            LlamaForCausalLM.from_pretrained(tmp_path)
        return str(err.value)

    assert "model.layers.1.mlp.up_proj.weight" in attempt(
        {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"}
    )
    assert "model.layers.0.extra.weight" in attempt(
        {**tensors, "model.layers.0.extra.weight": tensors["model.norm.weight"]}
    )
    msg = attempt({**tensors, "model.norm.weight": kael.zeros(65)})
    assert "model.norm.weight" in msg and "65" in msg
    # a config that disagrees with the weights: every projection's shape is named
    msg = attempt(tensors, {**config, "intermediate_size": 96})
    assert "gate_proj" in msg and "96" in msg
    msg = attempt(tensors, {**config, "num_key_value_heads": 4})
    assert "k_proj" in msg
    # a tied config may carry lm_head.weight only when it equals the embeddings
    tied = {**config, "tie_word_embeddings": True}
    assert "differs" in attempt(tensors, tied)


def test_tied_checkpoint_without_and_with_equal_head(tmp_path: Path) -> None:
    hf = build(tmp_path, "llama", tie_word_embeddings=True)
    m = LlamaForCausalLM.from_pretrained(tmp_path)
    assert "lm_head.weight" not in dict(m.named_parameters())
    assert m.lm_head_weight is m.model.embed_tokens.weight
    ts = _tensors(tmp_path)
    ts["lm_head.weight"] = ts["model.embed_tokens.weight"]
    kael.save_safetensors(ts, tmp_path / "model.safetensors")
    again = LlamaForCausalLM.from_pretrained(tmp_path)
    np.testing.assert_array_equal(again.lm_head_weight.detach().numpy(), hf.lm_head.weight.detach().numpy())


def test_old_rotary_buffers_are_ignored(tmp_path: Path, saved: tuple[Path, Any]) -> None:
    d, _ = saved
    (tmp_path / "config.json").write_text((d / "config.json").read_text())
    ts = _tensors(d)
    ts["model.layers.0.self_attn.rotary_emb.inv_freq"] = kael.ones(8)
    kael.save_safetensors(ts, tmp_path / "model.safetensors")
    m = LlamaForCausalLM.from_pretrained(tmp_path)
    assert "model.layers.0.self_attn.rotary_emb.inv_freq" not in dict(m.named_parameters())


def test_dtype_choices(tmp_path: Path) -> None:
    hf = build(tmp_path, "mistral", save_dtype=torch.bfloat16)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    m = LlamaForCausalLM.from_pretrained(tmp_path)  # None: float32 compute
    assert m.dtype is kael.float32
    w = m.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    np.testing.assert_array_equal(w, hf.model.layers[0].self_attn.q_proj.weight.float().detach().numpy())
    assert LlamaForCausalLM.from_pretrained(tmp_path, dtype="auto").dtype is kael.bfloat16
    assert LlamaForCausalLM.from_pretrained(tmp_path, dtype=kael.float64).dtype is kael.float64
    with pytest.raises(kael.DTypeError, match="floating point"):
        LlamaForCausalLM.from_pretrained(tmp_path, dtype=kael.int32)


def test_mmap_load_equals_copy_load(saved: tuple[Path, Any]) -> None:
    d, _ = saved
    a, b = LlamaForCausalLM.from_pretrained(d), LlamaForCausalLM.from_pretrained(d, mmap=True)
    for (n1, p1), (n2, p2) in zip(a.named_parameters(), b.named_parameters()):
        assert n1 == n2
        np.testing.assert_array_equal(p1.detach().numpy(), p2.detach().numpy())


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_save_pretrained_is_read_by_transformers_and_kael(tmp_path: Path, family: str) -> None:
    extra = {"attention_bias": True, "head_dim": 24, "rope_parameters": {**ROPES["llama3"], "rope_theta": 1e4}}
    hf = build(tmp_path / "src", family, tie_word_embeddings=family != "llama", **(extra if family == "llama" else {}))
    m = LlamaForCausalLM.from_pretrained(tmp_path / "src")
    m.save_pretrained(tmp_path / "out")
    again = LlamaForCausalLM.from_pretrained(tmp_path / "out")
    assert again.config == m.config
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(back) is type(hf)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        np.testing.assert_allclose(back(ids).logits.numpy(), hf(ids).logits.numpy(), atol=1e-5, rtol=0)
    params = {**dict(again.named_parameters()), "lm_head.weight": again.lm_head_weight}
    assert set(params) == set(hf.state_dict())  # transformers lists the tied head too
    for name, t in hf.state_dict().items():
        np.testing.assert_array_equal(params[name].detach().numpy(), t.numpy())


def test_sharded_checkpoint_loads(tmp_path: Path) -> None:
    hf = build(tmp_path / "src", "llama")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    a, b = LlamaForCausalLM.from_pretrained(tmp_path / "src"), LlamaForCausalLM.from_pretrained(tmp_path / "sharded")
    for (n1, p1), (_, p2) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p1.detach().numpy(), p2.detach().numpy(), err_msg=n1)
