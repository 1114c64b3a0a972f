"""Multimodal Gemma 3 checkpoints (``model_type`` ``"gemma3"``, kael/models/gemma3/_multimodal.py): the text model
of a random transformers ``Gemma3ForConditionalGeneration`` (a SigLIP tower of one layer beside it) loads as the
``gemma3_text`` family's ``Gemma3ForCausalLM`` through ``kael.models.from_pretrained``, in both key layouts
(``language_model.model.*``, which transformers 5 saves, and ``model.language_model.*``), from a ``text_config``
that names only the fields differing from ``Gemma3TextConfig``'s defaults, as Google's do.

Oracles: transformers' ``Gemma3ForConditionalGeneration`` on the same weights (text-only logits within 1e-4, 16
greedy tokens), its ``Gemma3Config`` read of the same config.json (the defaults), the bfloat16 weights it saved
(exact float32 values), and llama.cpp's converter's GGUF file of the checkpoint (skipped without it). Malformed
checkpoints are FormatErrors naming the file and the rule.

The text shape keeps to what a GGUF file can say (test_gemma3_gguf.py): six layers with the default pattern (five
sliding, one full), query_pre_attn_scalar = head_dim, sliding rope base 10000; a window of 5 positions.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import family_parity as fp
import kael
import numpy as np
import pytest
from gguf_models_common import TEXT as TEXT_FOR_GGUF
from hf_fixtures import write_llama3
from kael.models import families, from_pretrained, load_gguf
from kael.models.gemma3 import TEXT_CONFIG_DEFAULTS, Gemma3ForCausalLM, read_config
from kael.tokenizer import load_tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TEXT: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "query_pre_attn_scalar": 16,
    "sliding_window": 5,
    "max_position_embeddings": 96,
    "rope_scaling": {"rope_type": "linear", "factor": 2.0},
}
VISION: dict[str, Any] = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
}
#: A prompt of 30 tokens: six windows long.
LONG = [(13 * i + 7) % 300 for i in range(30)]


def _text_config_as_google_writes_it(vocab_size: int) -> dict[str, Any]:
    """``TEXT`` as a gemma3 config.json's text_config: the model type and the fields that differ from the
    defaults (no layer_types, no rope_parameters: transformers derives them)."""
    return {"model_type": "gemma3_text", "vocab_size": vocab_size, "initializer_range": 0.2, **TEXT}


def _save_new_layout(src: Path, dst: Path) -> Path:
    """``src`` (transformers 5's layout) with its tensors renamed as transformers 4.52+ writes them."""
    import shutil

    shutil.copytree(src, dst)
    tensors = safetensors_torch.load_file(str(src / "model.safetensors"))
    renamed = {}
    for k, v in tensors.items():
        if k.startswith("language_model.model."):
            k = "model.language_model." + k[len("language_model.model.") :]
        elif k.startswith(("vision_tower.", "multi_modal_projector.")):
            k = "model." + k
        renamed[k] = v
    safetensors_torch.save_file(renamed, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """(directory, transformers model): a random Gemma3ForConditionalGeneration (norm weights N(0, 0.3)) with a
    Llama-3-style tokenizer, its config.json's text_config trimmed to the non-default fields."""
    d = tmp_path_factory.mktemp("gemma3-multimodal")
    write_llama3(d)
    text = _text_config_as_google_writes_it(load_tokenizer(d).vocab_size)
    config = transformers.Gemma3Config(
        text_config=text, vision_config=VISION, mm_tokens_per_image=4, initializer_range=0.2
    )
    torch.manual_seed(3)
    hf = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "language_model" in name and name.endswith("norm.weight"):
                p.normal_(0.0, 0.3)
    hf.save_pretrained(d)
    saved = json.loads((d / "config.json").read_text())
    saved["text_config"] = text
    (d / "config.json").write_text(json.dumps(saved, indent=2))
    back = transformers.Gemma3Config.from_pretrained(d).text_config  # the trimmed file says the same to transformers
    assert back.layer_types == hf.config.text_config.layer_types and back.head_dim == 16
    assert back.rope_parameters == hf.config.text_config.rope_parameters
    return d, hf


@pytest.fixture(scope="module")
def model(checkpoint: tuple[Path, Any]) -> Any:
    return from_pretrained(checkpoint[0])


def test_registered_as_the_gemma3_family() -> None:
    fp.check_registered("gemma3", "Gemma 3", "Gemma3ForConditionalGeneration", "vision tower", "not loaded")
    assert families()["gemma3"].load == families()["gemma3_text"].load
    assert families()["gemma3"].gguf_architectures == ()  # the text model's GGUF files are gemma3_text's


def test_an_empty_text_config_is_transformers_defaults(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": {}}))
    cfg, want = read_config(tmp_path), transformers.Gemma3Config.from_pretrained(tmp_path).text_config
    for key in TEXT_CONFIG_DEFAULTS:
        if key != "pad_token_id":
            assert getattr(cfg, key) == getattr(want, key), key
    assert cfg.model_type == "gemma3_text" and cfg.layer_types == tuple(want.layer_types)
    assert (cfg.sliding_window, cfg.query_pre_attn_scalar) == (want.sliding_window, want.query_pre_attn_scalar)
    assert cfg.rope_theta == want.rope_parameters["full_attention"]["rope_theta"]
    assert cfg.sliding_rope_theta == want.rope_parameters["sliding_attention"]["rope_theta"]
    assert cfg.tie_word_embeddings and cfg.final_logit_softcapping is None


def test_config_and_weights(checkpoint: tuple[Path, Any], model: Any, caplog: pytest.LogCaptureFixture) -> None:
    d, hf = checkpoint
    cfg = model.config
    assert isinstance(model, Gemma3ForCausalLM) and cfg.model_type == "gemma3_text"
    assert cfg.layer_types == tuple(hf.config.text_config.layer_types) and cfg.scale == 16**-0.5
    assert cfg.rope_scaling.rope_type == "linear" and cfg.tie_word_embeddings
    state = hf.state_dict()
    names = {n for n, _ in model.named_parameters()}
    assert names == {"model." + k[len("model.language_model.") :] for k in state if "language_model" in k}
    for name, p in model.named_parameters():
        want = state["model.language_model." + name[len("model.") :]].numpy()
        np.testing.assert_array_equal(p.detach().numpy(), want, err_msg=name)
    with caplog.at_level(logging.INFO, logger="kael.models.gemma3"):
        from_pretrained(d)
    vision = sum(not k.startswith("model.language_model.") and k != "lm_head.weight" for k in state)
    assert f"its {vision} vision tower and projector tensors are not loaded" in caplog.text


def test_logits_match_transformers(checkpoint: tuple[Path, Any], model: Any) -> None:
    _, hf = checkpoint
    for ids in [*fp.PROMPTS, LONG]:
        np.testing.assert_allclose(fp.logits(model, ids), fp.hf_logits(hf, [ids])[0], atol=1e-4, rtol=0)


def test_greedy_tokens_match_transformers(checkpoint: tuple[Path, Any], model: Any) -> None:
    _, hf = checkpoint
    for ids in (fp.PROMPTS[0], LONG[:9]):
        assert model.generate(ids, 16) == fp.hf_greedy(hf, ids, 16)


def test_the_4_52_key_layout_and_a_mapped_load_give_the_same(
    checkpoint: tuple[Path, Any], model: Any, tmp_path: Path
) -> None:
    d, _ = checkpoint
    want = fp.logits(model, LONG)
    for other in (from_pretrained(_save_new_layout(d, tmp_path / "new")), from_pretrained(d, mmap=True)):
        np.testing.assert_array_equal(fp.logits(other, LONG), want)


def test_a_bfloat16_checkpoint_loads_its_values(checkpoint: tuple[Path, Any], tmp_path: Path) -> None:
    d, hf = checkpoint
    half = type(hf)(hf.config).eval()
    half.load_state_dict(hf.state_dict())
    half.to(torch.bfloat16).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((d / "config.json").read_text())
    model: Any = from_pretrained(tmp_path)
    assert model.dtype is kael.float32
    state = half.state_dict()
    for name, p in model.named_parameters():
        want = state["model.language_model." + name[len("model.") :]].float().numpy()
        np.testing.assert_array_equal(p.detach().numpy(), want, err_msg=name)
    assert from_pretrained(tmp_path, dtype="auto").dtype is kael.bfloat16


def test_save_pretrained_writes_the_text_model(model: Any, checkpoint: tuple[Path, Any], tmp_path: Path) -> None:
    """The loaded model is a gemma3_text model: it saves as one, which transformers reads with the same logits."""
    _, hf = checkpoint
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gemma3_text"
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    np.testing.assert_allclose(fp.hf_logits(back, [LONG]), fp.hf_logits(hf, [LONG]), atol=1e-5, rtol=0)


def _drop_text_config(d: Path) -> None:
    c = json.loads((d / "config.json").read_text())
    del c["text_config"]
    (d / "config.json").write_text(json.dumps(c))


def _edit_config(**changes: Any) -> Any:
    def edit(d: Path) -> None:
        c = json.loads((d / "config.json").read_text())
        c.update(changes)
        (d / "config.json").write_text(json.dumps(c))

    return edit


def _drop_tensors(*prefixes: str) -> Any:
    def edit(d: Path) -> None:
        tensors = safetensors_torch.load_file(str(d / "model.safetensors"))
        kept = {k: v for k, v in tensors.items() if not k.startswith(prefixes)}
        safetensors_torch.save_file(kept, str(d / "model.safetensors"), metadata={"format": "pt"})

    return edit


# name -> (how the checkpoint is broken, the message, the file or directory named)
MALFORMED = {
    "no_text_config": (_drop_text_config, r"text_config is missing", "config.json"),
    "text_config_a_list": (_edit_config(text_config=[1]), r"text_config must be an object, got list", "config.json"),
    "text_config_of_gemma2": (
        _edit_config(text_config={"model_type": "gemma2"}),
        r"text_config's model_type is 'gemma2', expected 'gemma3_text'",
        "config.json",
    ),
    "bad_text_field": (
        _edit_config(text_config={"num_attention_heads": 3, "num_key_value_heads": 2}),
        r"Gemma3 config \(text_config\) .*num_attention_heads 3 is not a multiple of num_key_value_heads 2",
        "config.json",
    ),
    "weight_missing": (
        _drop_tensors("language_model.model.layers.1.mlp.up_proj.weight"),
        r"checkpoint contents: missing tensor\(s\) \['language_model\.model\.layers\.1\.mlp\.up_proj\.weight'\]",
        "gemma3-malformed",
    ),
    "no_text_model": (
        _drop_tensors("language_model."),
        r"expected the text model's tensors under one of .* found neither",
        "gemma3-malformed",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_checkpoint_is_a_format_error(
    checkpoint: tuple[Path, Any], tmp_path_factory: pytest.TempPathFactory, case: str
) -> None:
    import shutil

    d = tmp_path_factory.mktemp("gemma3-malformed")
    shutil.copytree(checkpoint[0], d, dirs_exist_ok=True)
    edit, match, named = MALFORMED[case]
    edit(d)
    with pytest.raises(kael.FormatError, match=match) as err:
        from_pretrained(d)
    assert named in str(err.value)


def test_llama_cpp_converts_the_text_model(checkpoint: tuple[Path, Any], model: Any) -> None:
    """llama.cpp's converter writes the checkpoint's text model as a ``gemma3`` file without the vision tensors
    (skipped without the converter), which loads as Gemma3ForCausalLM with transformers' logits."""
    import family_gguf as fg

    pytest.importorskip("gguf")
    d, hf = checkpoint
    path = fg.convert(d, d / "converted-f32.gguf")
    with kael.io.read_gguf(path) as f:
        assert f.metadata["general.architecture"] == "gemma3"
        assert not [n for n in f.tensors if not n.startswith(("blk.", "token_embd.", "output_norm."))]
    got, tok = load_gguf(path)
    assert isinstance(got, Gemma3ForCausalLM) and got.config.layer_types == model.config.layer_types
    ids = fg.text_ids(d)
    assert tok.encode(TEXT_FOR_GGUF * 2) == ids
    np.testing.assert_allclose(fp.logits(got, ids), fp.hf_logits(hf, [ids])[0], atol=1e-4, rtol=0)
    np.testing.assert_allclose(fp.logits(got, ids), fp.logits(model, ids), atol=1e-5, rtol=0)
