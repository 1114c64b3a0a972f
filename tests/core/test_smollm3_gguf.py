"""SmolLM3 GGUF files (kael/models/_gguf_llama.py, architecture ``smollm3``): llama.cpp's converter output of a
random transformers SmolLM3 checkpoint (``convert_hf_to_gguf.py --outtype f32``, found through
tests/llama_cpp_tools.py; skipped without it) loads as a ``SmolLM3ForCausalLM`` without rope on every fourth
layer (llama.cpp's fixed pattern: the file has no key for it), the checkpoint's tokenizer and transformers'
logits; ``llama-quantize``'s Q8_0 of that file loads with its bytes and the logits kael's own Q8_0 gives; kael's
``save_gguf`` writes a ``smollm3`` file that reads back the same and that llama.cpp (the ``llama_cpp`` package)
runs with the same logits, and refuses a model whose no-rope layers a file cannot express.

Oracles: transformers' SmolLM3ForCausalLM on the checkpoint, kael's ``from_pretrained`` of the checkpoint (F32
and ``weights="q8_0"``: the same GGML Q8_0 bytes as llama-quantize writes), and llama.cpp.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_gguf as fg
import kael
import pytest
from kael.models import from_pretrained, save_gguf
from kael.models.smollm3 import SmolLM3ForCausalLM
from smollm3_checkpoints import build

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

#: transformers' default pattern (no rope on layer 3), the one llama.cpp assumes; tied, and untied
#: multi-query (llama.cpp's smollm3 loads no attention biases).
SHAPES: dict[str, dict[str, Any]] = {
    "tied": {"tie_word_embeddings": True},
    "untied-mqa": {"tie_word_embeddings": False, "num_key_value_heads": 1},
}
# Q8_0 against transformers' float32 logits (test_qwen3_gguf's reasoning), relative to the largest |logit|: four
# layers round more than test_granite_gguf's two. Measured on both shapes over seeds 4 to 7: max |diff| / max |logit|
# 0.08 to 0.13, top-1 agreement 0.85 to 0.95; the bounds leave margin. The exact check is against kael's own Q8_0
# of the checkpoint (the same bytes).
Q8_0_TOLERANCE = (0.25, 0.75)

checkpoint = fg.checkpoint_fixture("smollm3", SHAPES, build)


def _no_check(*args: Any) -> None:
    """SmolLM3's file has no keys or tensors of its own to check."""


def _default_pattern(model: Any, hf: Any) -> None:
    assert list(model.config.no_rope_layers or ()) == hf.config.no_rope_layers == [1, 1, 1, 0]


def test_converter_f32_file_matches_transformers(checkpoint: fg.Checkpoint) -> None:
    fg.check_converter_f32(checkpoint, "smollm3", SmolLM3ForCausalLM, _no_check, _default_pattern)


def test_llama_quantize_q8_0_file(checkpoint: fg.Checkpoint) -> None:
    fg.check_llama_quantize_q8_0(checkpoint, SmolLM3ForCausalLM, Q8_0_TOLERANCE, relative=True)


def test_save_gguf_round_trip(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    fg.check_save_gguf_round_trip(checkpoint, tmp_path, "smollm3", SmolLM3ForCausalLM, _no_check)


def test_llama_cpp_runs_kaels_file_with_the_same_logits(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    fg.check_llama_cpp_runs(checkpoint, tmp_path, "smollm3")


def test_a_no_rope_pattern_a_file_cannot_hold_is_refused(tmp_path: Path) -> None:
    """llama.cpp skips rope on every fourth layer of a smollm3 file whatever the model's no_rope_layers: save_gguf
    refuses another pattern rather than write a file that computes something else."""
    build(tmp_path, no_rope_layers=[1, 0, 0, 1])
    with pytest.raises(kael.KaelError, match=r"no_rope_layers \[1, 0, 0, 1\]"):
        save_gguf(from_pretrained(tmp_path), tmp_path / "bad.gguf")
    assert not (tmp_path / "bad.gguf").exists()


def test_llama_cpp_agrees_on_the_q8_0_file(checkpoint: fg.Checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """As fg.check_llama_cpp_agrees_on_q8_0; measured 287 ("tied") and 285 ("untied-mqa", 0.9896) of 288 top
    tokens the same: a float32 rounding difference moving one activation across an 8-bit step (logits equal to
    1e-5 up to a position, then up to 0.7% of the range apart) on logits whose median top-2 margin is 2.4% of
    the range. Over both shapes 572 of 576 (0.993)."""
    bounds = (0.02, 0.98) if not checkpoint[1].config.tie_word_embeddings else fg.Q8_0_LLAMA_CPP_BOUNDS
    fg.check_llama_cpp_agrees_on_q8_0(checkpoint, monkeypatch, bounds)
