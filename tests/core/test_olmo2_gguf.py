"""OLMo 2 GGUF files (kael/models/_gguf_llama.py, architecture ``olmo2``): llama.cpp's converter output of a random
transformers OLMo 2 checkpoint (``convert_hf_to_gguf.py --outtype f32``, found through tests/llama_cpp_tools.py;
skipped without it) loads as an ``Olmo2ForCausalLM`` with the checkpoint's tokenizer and transformers' logits;
``llama-quantize``'s Q8_0 of that file loads with its bytes and the logits kael's own Q8_0 gives; kael's
``save_gguf`` writes an ``olmo2`` file (``post_attention_norm``, ``post_ffw_norm``, whole-projection
``attn_q_norm`` / ``attn_k_norm``) that reads back the same and that llama.cpp (the ``llama_cpp`` package) runs
with the same logits.

Oracles: transformers' Olmo2ForCausalLM on the checkpoint, kael's ``from_pretrained`` of the checkpoint (F32
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
from kael.models.olmo2 import Olmo2ForCausalLM
from olmo2_checkpoints import build

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SHAPES: dict[str, dict[str, Any]] = {
    "untied-gqa": {"tie_word_embeddings": False},
    "tied-hd24-mqa": {"tie_word_embeddings": True, "head_dim": 24, "num_key_value_heads": 1},
}
# Q8_0 against transformers' float32 logits (test_qwen3_gguf's reasoning: every projection and the token table
# rounded to 8 bits per block of 32). Measured on these shapes over seeds 4 to 6: max |diff| 0.18 to 0.28 for
# logits of std about 1.6 (max |logit| 6 to 7.5), top-1 agreement 0.95 to 1.0; the bounds leave margin. The exact
# check is against kael's own Q8_0 of the checkpoint (the same bytes).
Q8_0_TOLERANCE = (0.6, 0.9)

checkpoint = fg.checkpoint_fixture("olmo2", SHAPES, build)


def _converted_file(f: Any, hf: Any) -> None:
    c = hf.config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    assert f.tensors["blk.1.attn_q_norm.weight"].shape == (c.num_attention_heads * hd,)
    assert f.tensors["blk.1.attn_k_norm.weight"].shape == (c.num_key_value_heads * hd,)
    assert "blk.0.post_ffw_norm.weight" in f.tensors and "blk.0.attn_norm.weight" not in f.tensors


def _converted_model(model: Any, hf: Any) -> None:
    assert not model.config.qk_norm and model.config.kv_heads == hf.config.num_key_value_heads


def _saved_file(f: Any, model: Any, hf: Any) -> None:
    c = model.config
    assert f.tensors["blk.0.attn_q_norm.weight"].shape == (c.num_attention_heads * c.dim,)
    assert f.tensors["blk.0.post_attention_norm.weight"].shape == (c.hidden_size,)
    assert "blk.0.ffn_norm.weight" not in f.tensors
    assert f.metadata["olmo2.attention.key_length"] == c.dim


def test_converter_f32_file_matches_transformers(checkpoint: fg.Checkpoint) -> None:
    fg.check_converter_f32(checkpoint, "olmo2", Olmo2ForCausalLM, _converted_file, _converted_model)


def test_llama_quantize_q8_0_file(checkpoint: fg.Checkpoint) -> None:
    fg.check_llama_quantize_q8_0(checkpoint, Olmo2ForCausalLM, Q8_0_TOLERANCE, relative=False)


def test_save_gguf_round_trip(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    fg.check_save_gguf_round_trip(checkpoint, tmp_path, "olmo2", Olmo2ForCausalLM, _saved_file)


def test_llama_cpp_runs_kaels_file_with_the_same_logits(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    if checkpoint[1].config.tie_word_embeddings:
        # llama.cpp 0.3.36's olmo2 loader requires output.weight ("check_tensor_dims: tensor 'output.weight' not
        # found"): it refuses the converter's file of a tied checkpoint as well (the released OLMo 2 are untied).
        pytest.skip("llama.cpp's olmo2 loads no tied head (neither the converter's file nor kael's)")
    fg.check_llama_cpp_runs(checkpoint, tmp_path, "olmo2")


def _kael_file(checkpoint: tuple[Path, Any], tmp_path: Path) -> Path:
    d, _ = checkpoint
    path = tmp_path / "kael-olmo2.gguf"
    save_gguf(from_pretrained(d), path)
    return path


@pytest.mark.parametrize("name", ["blk.1.attn_q_norm.weight", "blk.0.post_ffw_norm.weight"])
def test_an_olmo2_file_without_its_norms_is_refused(checkpoint: tuple[Path, Any], tmp_path: Path, name: str) -> None:
    bad = rewrite(_kael_file(checkpoint, tmp_path), tmp_path / "bad.gguf", drop=(name,))
    with pytest.raises(kael.FormatError, match=rf"missing tensor\(s\) \['{name.replace('.', '[.]')}'\]") as err:
        load_gguf(bad)
    assert "bad.gguf" in str(err.value)


def test_a_per_head_q_norm_is_refused_by_shape(checkpoint: tuple[Path, Any], tmp_path: Path) -> None:
    """Qwen3's per-head layout ([head_dim]) under OLMo 2's name is not OLMo 2's whole-projection norm."""
    import numpy as np

    path = _kael_file(checkpoint, tmp_path)
    dim = from_pretrained(checkpoint[0]).config.dim
    per_head = ("F32", (dim,), np.ones(dim, dtype=np.float32))
    bad = rewrite(path, tmp_path / "bad.gguf", replace={"blk.0.attn_q_norm.weight": per_head})
    with pytest.raises(kael.FormatError, match=r"blk\.0\.attn_q_norm\.weight"):
        load_gguf(bad)


def test_a_sliding_window_shorter_than_the_context_is_refused(checkpoint: tuple[Path, Any], tmp_path: Path) -> None:
    path = _kael_file(checkpoint, tmp_path)
    window = {"olmo2.attention.sliding_window": kael.io.GGUFValue("uint32", 8)}
    with pytest.raises(kael.FormatError, match="sliding_window"):
        load_gguf(rewrite(path, tmp_path / "bad.gguf", meta=window))
    # a window covering the context attends as full attention does
    window = {"olmo2.attention.sliding_window": kael.io.GGUFValue("uint32", 4096)}
    assert isinstance(load_gguf(rewrite(path, tmp_path / "wide.gguf", meta=window))[0], Olmo2ForCausalLM)


def test_llama_cpp_agrees_on_the_q8_0_file(checkpoint: fg.Checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    if checkpoint[1].config.tie_word_embeddings:
        pytest.skip(
            "llama.cpp's olmo2 loader requires output.weight, which its converter does not write for a tied "
            "checkpoint ('tensor output.weight not found'; real OLMo 2 checkpoints are untied)"
        )
    fg.check_llama_cpp_agrees_on_q8_0(checkpoint, monkeypatch)
