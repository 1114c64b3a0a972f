"""Phi-3 GGUF files (kael/models/_gguf_phi3.py, architecture ``phi3``): llama.cpp's converter output of a random
transformers Phi-3 checkpoint (``convert_hf_to_gguf.py --outtype f32``, found through tests/llama_cpp_tools.py;
skipped without it) loads as a ``Phi3ForCausalLM`` with its fused ``attn_qkv`` / ``ffn_up`` tensors, longrope's
``rope_factors_long`` / ``rope_factors_short`` tensors and attention factor, the rotary dims of a partial rotary
factor, the checkpoint's tokenizer and transformers' logits; ``llama-quantize``'s Q8_0 of that file loads with
the logits kael's own Q8_0 gives; kael's ``save_gguf`` writes a ``phi3`` file that reads back the same.

The longrope shape's ``original_max_position_embeddings`` is 8, shorter than every prompt here, so each pass
(and transformers' generate) uses the long factors (NOTE [longrope factors] in kael/models/phi3/_rope.py).

Oracles: transformers' Phi3ForCausalLM on the checkpoint, kael's ``from_pretrained`` of it (F32 and
``weights="q8_0"``), and llama.cpp.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import family_gguf as fg
import kael
import pytest
from gguf_models_common import rewrite
from hf_fixtures import write_llama3
from kael.models import load_gguf
from kael.models.phi3 import Phi3ForCausalLM
from kael.tokenizer import load_tokenizer
from phi3_checkpoints import build, longrope

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SHAPES: dict[str, dict[str, Any]] = {
    "gqa-untied-default": {"tie_word_embeddings": False},
    "tied-partial-longrope": {
        "tie_word_embeddings": True,
        "original_max_position_embeddings": 8,
        "rope_parameters": {**longrope(12, seed=6), "partial_rotary_factor": 0.75},
    },
}
# Q8_0 against transformers' float32 logits (test_qwen3_gguf's reasoning), relative to the largest |logit|:
# measured at seed 4 0.13 (the tied shape: its Q8_0 table is the head too) with top-1 agreement 0.92; the bounds
# leave margin. The exact check is against kael's own Q8_0 of the checkpoint (the same bytes).
Q8_0_TOLERANCE = (0.2, 0.85)


@pytest.fixture(scope="module", params=list(SHAPES))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> fg.Checkpoint:
    """(directory, transformers model) with a Llama-3-style tokenizer whose tokenizer_config.json names
    GPT2Tokenizer: llama.cpp's Phi-3 converter reads a BPE vocabulary only then (else SentencePiece's)."""
    d = tmp_path_factory.mktemp(f"phi3-{request.param}")
    write_llama3(d)
    p = d / "tokenizer_config.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "tokenizer_class": "GPT2Tokenizer"}))
    hf = build(d, seed=4, vocab_size=load_tokenizer(d).vocab_size, **SHAPES[request.param])
    return d, hf


def _file(f: Any, hf: Any) -> None:
    cfg, md = hf.config, f.metadata
    rot = int(cfg.hidden_size // cfg.num_attention_heads * cfg.rope_parameters["partial_rotary_factor"])
    assert md["phi3.rope.dimension_count"] == rot
    assert "blk.0.attn_qkv.weight" in f.tensors and "blk.0.attn_q.weight" not in f.tensors
    assert ("rope_factors_long.weight" in f.tensors) == (cfg.rope_parameters["rope_type"] == "longrope")


def _model(model: Any, hf: Any) -> None:
    rp, cfg = hf.config.rope_parameters, model.config
    assert cfg.rotary_dim == int(cfg.dim * rp["partial_rotary_factor"])
    if rp["rope_type"] == "longrope":
        assert cfg.longrope is not None and cfg.longrope.original_max_position_embeddings == 8
        assert list(cfg.longrope.long_factor) == pytest.approx(rp["long_factor"])
    else:
        assert cfg.longrope is None


def test_converter_f32_file_matches_transformers(checkpoint: fg.Checkpoint) -> None:
    fg.check_converter_f32(checkpoint, "phi3", Phi3ForCausalLM, _file, _model)


def test_llama_quantize_q8_0_file(checkpoint: fg.Checkpoint) -> None:
    fg.check_llama_quantize_q8_0(checkpoint, Phi3ForCausalLM, Q8_0_TOLERANCE, relative=True)


def test_save_gguf_round_trip(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    def saved(f: Any, model: Any, hf: Any) -> None:
        _file(f, hf)

    fg.check_save_gguf_round_trip(checkpoint, tmp_path, "phi3", Phi3ForCausalLM, saved)


def test_a_file_with_one_factor_list_is_refused(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    d, hf = checkpoint
    if hf.config.rope_parameters["rope_type"] != "longrope":
        pytest.skip("no longrope tensors")
    src = fg.convert(d, d / "converted-f32.gguf")
    out = rewrite(src, tmp_path / "one-list.gguf", drop=("rope_factors_short.weight",))
    with pytest.raises(kael.FormatError, match="rope_factors_short"):
        load_gguf(out)


def test_a_short_sliding_window_is_every_layers_window(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    d, _ = checkpoint
    src = fg.convert(d, d / "converted-f32.gguf")
    out = rewrite(src, tmp_path / "window.gguf", meta={"phi3.attention.sliding_window": 16})
    model = load_gguf(out)[0]
    assert model.config.sliding_window == 16 and set(model.config.layer_windows) == {16}
    assert all(blk.self_attn.window == 16 for blk in model.model.layers)
