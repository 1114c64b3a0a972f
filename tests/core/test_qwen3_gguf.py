"""Qwen3 GGUF files (kael/models/_gguf_llama.py, architecture ``qwen3``): llama.cpp's converter output of a random
transformers Qwen3 checkpoint (``convert_hf_to_gguf.py --outtype f32``, found through tests/llama_cpp_tools.py;
skipped without it) loads as a ``Qwen3ForCausalLM`` with the checkpoint's tokenizer and transformers' logits;
``llama-quantize``'s Q8_0 of that file loads with its bytes and the logits kael's own Q8_0 gives; kael's
``save_gguf`` writes a ``qwen3`` file that reads back the same and that llama.cpp (the ``llama_cpp`` package)
runs with the same logits.

Oracles: transformers' Qwen3ForCausalLM on the checkpoint, kael's ``from_pretrained`` of the checkpoint (F32
and ``weights="q8_0"``: the same GGML Q8_0 bytes as llama-quantize writes), and llama.cpp.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_gguf as fg
import kael
import pytest
from gguf_models_common import rewrite
from kael.models import from_pretrained, load_gguf, save_gguf
from kael.models.qwen3 import Qwen3ForCausalLM
from qwen3_checkpoints import build

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SHAPES: dict[str, dict[str, Any]] = {
    "tied-hd24": {"tie_word_embeddings": True, "head_dim": 24},
    "untied": {"tie_word_embeddings": False, "head_dim": 16, "num_key_value_heads": 1},
}
# Q8_0 against transformers' float32 logits: every projection and the token table (the tied head too) rounded
# to 8 bits per block of 32 (error up to 1/254 of the block's largest value). Measured on these shapes over six
# seeds: max |diff| 0.26 to 0.39 for logits of std about 1.6 (max |logit| 6 to 8), top-1 agreement 0.94 to 0.98;
# the bounds leave margin. The exact check is against kael's own Q8_0 of the checkpoint (the same bytes).
Q8_0_TOLERANCE = (0.6, 0.9)

checkpoint = fg.checkpoint_fixture("qwen3", SHAPES, build)


def _converted_file(f: Any, hf: Any) -> None:
    assert "blk.1.attn_k_norm.weight" in f.tensors


def _converted_model(model: Any, hf: Any) -> None:
    assert model.config.dim == hf.config.head_dim and model.config.qk_norm


def _saved_file(f: Any, model: Any, hf: Any) -> None:
    assert f.tensors["blk.0.attn_q_norm.weight"].shape == (model.config.dim,)
    assert f.metadata["qwen3.attention.key_length"] == model.config.dim


def test_converter_f32_file_matches_transformers(checkpoint: fg.Checkpoint) -> None:
    fg.check_converter_f32(checkpoint, "qwen3", Qwen3ForCausalLM, _converted_file, _converted_model)


def test_llama_quantize_q8_0_file(checkpoint: fg.Checkpoint) -> None:
    fg.check_llama_quantize_q8_0(checkpoint, Qwen3ForCausalLM, Q8_0_TOLERANCE, relative=False)


def test_save_gguf_round_trip(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    fg.check_save_gguf_round_trip(checkpoint, tmp_path, "qwen3", Qwen3ForCausalLM, _saved_file)


def test_llama_cpp_runs_kaels_file_with_the_same_logits(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    fg.check_llama_cpp_runs(checkpoint, tmp_path, "qwen3")


def test_a_qwen3_file_without_its_q_norm_is_refused(checkpoint: tuple[Path, Any], tmp_path: Path) -> None:
    d, _ = checkpoint
    path = tmp_path / "kael-qwen3.gguf"
    save_gguf(from_pretrained(d), path)
    bad = rewrite(path, tmp_path / "bad.gguf", drop=("blk.1.attn_q_norm.weight",))
    with pytest.raises(kael.FormatError, match=r"missing tensor\(s\) \['blk\.1\.attn_q_norm\.weight'\]"):
        load_gguf(bad)


def test_llama_cpp_agrees_on_the_q8_0_file(checkpoint: fg.Checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    fg.check_llama_cpp_agrees_on_q8_0(checkpoint, monkeypatch)
