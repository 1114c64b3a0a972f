"""GPT-2 (kael/models/): strict checkpoint loading and export.

Missing, unexpected, mis-shaped and untied keys, a bad config.json and missing files are
``kael.FormatError``s that name what is wrong, and a failed load leaves the parameters as they
were; ``save_pretrained`` writes a checkpoint that kael loads back unchanged and Hugging Face
transformers reads with the reference logits; a half-precision checkpoint is cast on load.
Oracles: tests/data/tiny-gpt2 (its weights and transformers' logits).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kael
import numpy as np
import pytest
from gpt2_reference import CASES, DATA, TOL
from gpt2_reference import logits_of as _logits
from kael.models import GPT, load_gpt2, save_pretrained

# -- strict loading ---------------------------------------------------------------------------


def _write_checkpoint(tmp: Path, tensors: dict[str, kael.Tensor], config: dict[str, Any] | None = None) -> Path:
    d = tmp / "ckpt"
    d.mkdir(exist_ok=True)
    kael.save_safetensors(tensors, d / "model.safetensors")
    cfg = config if config is not None else json.loads((DATA / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture
def hf_tensors() -> dict[str, kael.Tensor]:
    return dict(kael.load_safetensors(DATA / "model.safetensors"))


def test_missing_and_unexpected_keys_are_named(tmp_path: Path, hf_tensors: dict[str, kael.Tensor]) -> None:
    del hf_tensors["transformer.h.1.ln_2.bias"]
    hf_tensors["transformer.h.0.attn.extra"] = kael.zeros(3)
    d = _write_checkpoint(tmp_path, hf_tensors)
    with pytest.raises(kael.FormatError) as info:
        GPT.from_pretrained(d)
    msg = str(info.value)
    assert "missing" in msg and "'transformer.h.1.ln_2.bias'" in msg
    assert "unexpected" in msg and "'transformer.h.0.attn.extra'" in msg


def test_shape_mismatch_is_named(tmp_path: Path, hf_tensors: dict[str, kael.Tensor]) -> None:
    hf_tensors["transformer.h.0.mlp.c_fc.weight"] = kael.zeros(128, 32)  # transposed
    with pytest.raises(
        kael.FormatError,
        match=r"'transformer\.h\.0\.mlp\.c_fc\.weight' has shape \[128, 32\].*"
        r"\[32, 128\]",
    ):
        GPT.from_pretrained(_write_checkpoint(tmp_path, hf_tensors))


def test_tied_lm_head_is_ignored_only_when_equal(
    tmp_path: Path, hf_tensors: dict[str, kael.Tensor], model: GPT
) -> None:
    hf_tensors["lm_head.weight"] = hf_tensors["transformer.wte.weight"].clone()
    m = GPT.from_pretrained(_write_checkpoint(tmp_path, hf_tensors))
    ids = CASES["prompt0"]["ids"]
    np.testing.assert_array_equal(_logits(m, [ids]), _logits(model, [ids]))
    hf_tensors["lm_head.weight"] = hf_tensors["lm_head.weight"] * 2.0
    with pytest.raises(kael.FormatError, match="untied LM head"):
        GPT.from_pretrained(_write_checkpoint(tmp_path, hf_tensors))


def test_bare_layout_strictness(tmp_path: Path) -> None:
    bare = dict(kael.load_safetensors(DATA / "model-bare-layout.safetensors"))
    bare["h.5.attn.bias"] = kael.zeros(1)  # a mask buffer of any layer is ignored...
    del bare["ln_f.weight"]
    bare["h.0.attn.c_attn.bias_extra"] = kael.zeros(1)  # ...other strangers are not
    m = GPT(50257, 64, 2, 2, 32, init=False)
    kael.save_safetensors(bare, tmp_path / "bare.safetensors")
    with pytest.raises(kael.FormatError) as info:
        load_gpt2(m, tmp_path / "bare.safetensors")
    msg = str(info.value)
    assert "['ln_f.weight']" in msg and "['h.0.attn.c_attn.bias_extra']" in msg and "h.5.attn.bias" not in msg


def test_failed_load_leaves_parameters_unchanged(
    tmp_path: Path, hf_tensors: dict[str, kael.Tensor], model: GPT
) -> None:
    m = GPT.from_pretrained(DATA)
    del hf_tensors["transformer.wpe.weight"]
    kael.save_safetensors(hf_tensors, tmp_path / "partial.safetensors")
    with pytest.raises(kael.FormatError, match="transformer.wpe.weight"):
        load_gpt2(m, tmp_path / "partial.safetensors")
    np.testing.assert_array_equal(m.wte.weight.detach().numpy(), model.wte.weight.detach().numpy())


@pytest.mark.parametrize(
    "change, match",
    [
        ({"n_layer": None}, "missing key 'n_layer'"),
        ({"n_head": 3}, "not divisible"),
        ({"n_embd": 0}, "n_embd must be a positive integer"),
        ({"n_positions": True}, "n_positions must be a positive integer"),
        ({"activation_function": "relu"}, "activation_function 'relu'"),
        ({"model_type": "llama"}, "model_type"),
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ],
)
def test_bad_config_is_a_format_error(
    tmp_path: Path, hf_tensors: dict[str, kael.Tensor], change: dict[str, Any], match: str
) -> None:
    cfg = json.loads((DATA / "config.json").read_text())
    for k, v in change.items():
        if v is None:
            del cfg[k]
        else:
            cfg[k] = v
    with pytest.raises(kael.FormatError, match=match):
        GPT.from_pretrained(_write_checkpoint(tmp_path, hf_tensors, cfg))


def test_missing_files_are_format_errors(tmp_path: Path) -> None:
    with pytest.raises(kael.FormatError, match="not a directory"):
        GPT.from_pretrained(tmp_path / "nope")
    with pytest.raises(kael.FormatError, match="config.json"):
        GPT.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(kael.FormatError, match="JSON object"):
        GPT.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((DATA / "config.json").read_text())
    with pytest.raises(kael.FormatError, match="no such file"):
        GPT.from_pretrained(tmp_path)


# -- export -----------------------------------------------------------------------------------


def test_save_pretrained_round_trip(tmp_path: Path, model: GPT) -> None:
    save_pretrained(model, tmp_path / "out")
    tensors, meta = kael.io.load_safetensors_with_metadata(tmp_path / "out" / "model.safetensors")
    assert meta == {"format": "pt"}
    assert set(tensors) == {"transformer." + n for n, _ in model.named_parameters()}
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    sizes = (cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["n_positions"], cfg["vocab_size"])
    assert sizes == (2, 2, 32, 64, 50257)
    assert cfg["model_type"] == "gpt2" and cfg["activation_function"] == "gelu_new"
    again = GPT.from_pretrained(tmp_path / "out")
    ids = CASES["prompt2"]["ids"]
    np.testing.assert_array_equal(_logits(again, [ids]), _logits(model, [ids]))


def test_half_precision_checkpoint_is_cast_on_load(tmp_path: Path, hf_tensors: dict[str, kael.Tensor]) -> None:
    half = {k: v.to(dtype=kael.float16) for k, v in hf_tensors.items()}
    m = GPT.from_pretrained(_write_checkpoint(tmp_path, half))
    assert m.dtype is kael.float32
    got = m.h[1].mlp.c_fc.weight.detach().numpy()
    want = hf_tensors["transformer.h.1.mlp.c_fc.weight"].numpy().astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    wide = GPT.from_pretrained(_write_checkpoint(tmp_path, half), dtype=kael.float64)
    assert wide.dtype is kael.float64 and wide.generate([1, 2], 3) == m.generate([1, 2], 3)


def test_transformers_reads_the_export(tmp_path: Path, model: GPT, ref_logits: dict[str, np.ndarray]) -> None:
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    save_pretrained(model, tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    case = CASES["prompt1"]
    with torch.no_grad():
        got = hf(torch.tensor([case["ids"]])).logits[0].numpy()
    assert np.abs(got - ref_logits[case["logits_key"]]).max() < TOL
