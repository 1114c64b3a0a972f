"""Gemma 3 GGUF files (kael/models/gemma3/_gguf.py, architecture ``gemma3``): llama.cpp's converter output of a
random transformers Gemma3ForCausalLM checkpoint (``convert_hf_to_gguf.py --outtype f32``, found through
tests/llama_cpp_tools.py; skipped without it), whose norms it stores as 1 + w, loads as a ``Gemma3ForCausalLM``
with the checkpoint's tokenizer and transformers' logits; ``llama-quantize``'s Q8_0 of that file loads with its
bytes and the logits kael's own Q8_0 gives; kael's ``save_gguf`` writes a ``gemma3`` file that reads back the
same and that llama.cpp (the ``llama_cpp`` package) runs with the same logits.

The shapes keep to what a GGUF file can say (NOTE in gemma3/_gguf.py): ``query_pre_attn_scalar`` = head_dim,
the default pattern (six layers: five sliding, one full), sliding rope base 10000; windows of 5 and 8 positions,
shorter than the test text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_gguf as fg
import kael
import llama_cpp_tools
import numpy as np
import pytest
from gemma3_checkpoints import build
from gguf_models_common import TEXT, logits_of, rewrite
from kael.models import from_pretrained, load_gguf, save_gguf
from kael.models.gemma3 import Gemma3ForCausalLM
from kael.tokenizer import load_tokenizer

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

_GGUF = {"query_pre_attn_scalar": 16, "rope_local_base_freq": 10000.0, "num_hidden_layers": 6, "sliding_window": 5}
SHAPES: dict[str, dict[str, Any]] = {
    "tied-gqa": _GGUF,
    "untied-mqa": {**_GGUF, "tie_word_embeddings": False, "num_key_value_heads": 1, "sliding_window": 8,
                   "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
}  # fmt: skip
# Q8_0 against transformers' float32 logits: every projection and the token table rounded to 8 bits per block of
# 32; the exact check is against kael's own Q8_0 of the checkpoint (the same bytes).
Q8_0_TOLERANCE = (0.6, 0.9)

checkpoint = fg.checkpoint_fixture("gemma3", SHAPES, build)


def _converted_file(f: Any, hf: Any) -> None:
    assert "blk.1.post_ffw_norm.weight" in f.tensors and "blk.0.attn_q_norm.weight" in f.tensors
    assert f.metadata["gemma3.attention.sliding_window"] == hf.config.sliding_window
    # llama.cpp's converter stores the norms as 1 + w (NOTE [gemma gguf norms])
    stored = np.asarray(f.tensors["blk.0.ffn_norm.weight"].data, dtype=np.float32)
    w = hf.model.layers[0].pre_feedforward_layernorm.weight.detach().numpy()
    np.testing.assert_allclose(stored, w + 1, atol=1e-6, rtol=0)


def _converted_model(model: Any, hf: Any) -> None:
    assert model.config.layer_types == tuple(hf.config.layer_types)
    w = hf.model.layers[0].pre_feedforward_layernorm.weight.detach().numpy()
    np.testing.assert_allclose(
        model.model.layers[0].pre_feedforward_layernorm.weight.detach().numpy(), w, atol=1e-6, rtol=0
    )


def _saved_file(f: Any, model: Any, hf: Any) -> None:
    assert f.tensors["blk.0.attn_q_norm.weight"].shape == (model.config.dim,)
    assert f.metadata["gemma3.attention.sliding_window"] == model.config.sliding_window
    stored = np.asarray(f.tensors["output_norm.weight"].data, dtype=np.float32)
    np.testing.assert_array_equal(stored, model.model.norm.weight.detach().numpy() + np.float32(1))


def test_converter_f32_file_matches_transformers(checkpoint: fg.Checkpoint) -> None:
    fg.check_converter_f32(checkpoint, "gemma3", Gemma3ForCausalLM, _converted_file, _converted_model)


def test_llama_quantize_q8_0_file(checkpoint: fg.Checkpoint) -> None:
    fg.check_llama_quantize_q8_0(checkpoint, Gemma3ForCausalLM, Q8_0_TOLERANCE, relative=False)


def test_save_gguf_round_trip(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    fg.check_save_gguf_round_trip(checkpoint, tmp_path, "gemma3", Gemma3ForCausalLM, _saved_file)


def test_llama_cpp_runs_kaels_file_with_the_same_logits(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    """llama.cpp (the llama_cpp package; skipped without it) runs kael's F32 file with its tokens and logits.

    family_gguf's 1e-3 bound does not hold for Gemma: llama.cpp's CPU GELU reads a float16 table, so every MLP
    activation is off by up to ~1e-3 relative; measured max |diff| 1e-3 to 3e-3 at every position (the first
    ones, inside every window, too: no mask or rope difference), for logits of max |logit| about 5-10."""
    llama_cpp = pytest.importorskip("llama_cpp", reason=llama_cpp_tools.SKIP_REASON + ": no llama_cpp package")
    d, _ = checkpoint
    model = from_pretrained(d)
    path = tmp_path / "kael-gemma3.gguf"
    save_gguf(model, path, load_tokenizer(d))
    ids = fg.text_ids(d)
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=128, verbose=False, type_k=0, type_v=0)
    assert llm.tokenize((TEXT * 2).encode(), add_bos=True, special=True) == ids
    llm.eval(ids)
    theirs = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
    ours = logits_of(model, ids)
    assert float(np.abs(theirs - ours).max()) < 1e-2
    assert (theirs.argmax(-1) == ours.argmax(-1)).all()


def test_a_gemma3_file_without_a_post_ffw_norm_is_refused(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    d, _ = checkpoint
    path = tmp_path / "kael-gemma3.gguf"
    save_gguf(from_pretrained(d), path)
    bad = rewrite(path, tmp_path / "bad.gguf", drop=("blk.2.post_ffw_norm.weight",))
    with pytest.raises(kael.FormatError, match=r"missing tensor\(s\) \['blk\.2\.post_ffw_norm\.weight'\]"):
        load_gguf(bad)


def test_what_a_gguf_file_cannot_say_is_refused(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    """save_gguf refuses a scale, a layer pattern or a sliding rope base llama.cpp would read otherwise."""
    d, _ = checkpoint
    model = from_pretrained(d)
    cfg = model.config
    for change, match in (
        ({"query_pre_attn_scalar": 256.0}, "query_pre_attn_scalar"),
        ({"layer_types": ("full_attention",) * cfg.num_hidden_layers}, "layer_types"),
        ({"sliding_rope_theta": 50.0}, "rope"),
    ):
        import dataclasses

        model.config = dataclasses.replace(cfg, **change)
        with pytest.raises(kael.KaelError, match=match):
            save_gguf(model, tmp_path / "refused.gguf")
    model.config = cfg
    np.testing.assert_array_equal(logits_of(model, [1, 2, 3]), logits_of(from_pretrained(d), [1, 2, 3]))


def test_llama_cpp_agrees_on_the_q8_0_file(checkpoint: fg.Checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """As fg.check_llama_cpp_agrees_on_q8_0, where llama.cpp's CPU GELU reads a float16 table: with kael's
    float32 GELU (the default) 280 of 288 top tokens measured the same (0.972) on both shapes; with
    KAEL_GELU=ggml (the table, NOTE [ggml GELU table]) 287 ("tied-gqa") and 288 ("untied-mqa"), within
    Q8_0_LLAMA_CPP_BOUNDS."""
    fg.check_llama_cpp_agrees_on_q8_0(checkpoint, monkeypatch, (0.03, 0.96))
    monkeypatch.setenv("KAEL_GELU", "ggml")
    fg.check_llama_cpp_agrees_on_q8_0(checkpoint, monkeypatch)
