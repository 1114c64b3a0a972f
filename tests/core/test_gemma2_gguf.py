"""Gemma 2 GGUF files (kael/models/gemma3/_gguf.py, architecture ``gemma2``): llama.cpp's converter output of a
random transformers Gemma2ForCausalLM checkpoint with a small SentencePiece ``tokenizer.model`` (the gemma2
converter reads only that; ``convert_hf_to_gguf.py --outtype f32``, found through tests/llama_cpp_tools.py;
skipped without it), whose norms it stores as 1 + w, loads as a ``Gemma2ForCausalLM`` with transformers' logits
and greedy tokens; ``llama-quantize``'s Q8_0 of that file loads with its bytes and the logits kael's own Q8_0
gives; kael's ``save_gguf`` writes a ``gemma2`` file that reads back the same and that llama.cpp (the
``llama_cpp`` package) runs with the same logits.

The shapes keep to what the converter writes and llama.cpp reads (NOTE in gemma3/_gguf.py): tied embeddings (it
drops ``lm_head.weight``), no rope key (base 10000), ``query_pre_attn_scalar`` = head_dim, alternating layers.
"""

from __future__ import annotations

import io
import subprocess
from pathlib import Path
from typing import Any

import family_gguf as fg
import kael
import llama_cpp_tools
import numpy as np
import pytest
from gemma2_checkpoints import build
from gguf_models_common import logits_of, rewrite
from hf_fixtures import CORPUS, write_llama3
from kael.models import from_pretrained, load_gguf, save_gguf
from kael.models.gemma2 import Gemma2ForCausalLM
from kael.tokenizer import load_tokenizer

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

_GGUF = {"query_pre_attn_scalar": 16, "rope_theta": 10000.0}
SHAPES: dict[str, dict[str, Any]] = {
    "gqa": _GGUF,
    "mqa-window8": {**_GGUF, "num_key_value_heads": 1, "sliding_window": 8, "num_hidden_layers": 4},
}
IDS = [(13 * i + 7) % 200 for i in range(30)]
# Q8_0 against transformers' float32 logits (8 bits per block of 32); the exact check is kael's own Q8_0
Q8_0_TOLERANCE = (0.6, 0.9)


@pytest.fixture(scope="module", params=list(SHAPES))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> fg.Checkpoint:
    """(directory, transformers model): a random gemma2 checkpoint with a SentencePiece tokenizer.model."""
    d = tmp_path_factory.mktemp(f"gemma2-{request.param}")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 4), model_writer=model, vocab_size=120, model_type="bpe",
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, character_coverage=1.0, minloglevel=2, hard_vocab_limit=False,
    )  # fmt: skip
    (d / "tokenizer.model").write_bytes(model.getvalue())
    vocab = load_tokenizer(write_llama3(d / "bpe")).vocab_size  # what save_gguf writes (byte-level BPE)
    return d, build(d, seed=4, vocab_size=vocab, **SHAPES[request.param])


def _hf_logits(hf: Any, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        out: np.ndarray = hf(torch.tensor([ids])).logits[0].numpy()
    return out


def test_converter_f32_file_matches_transformers(checkpoint: fg.Checkpoint) -> None:
    d, hf = checkpoint
    path = fg.convert(d, d / "converted-f32.gguf")
    with kael.io.read_gguf(path) as f:
        assert f.metadata["general.architecture"] == "gemma2" and "output.weight" not in f.tensors
        assert f.metadata["gemma2.attn_logit_softcapping"] == hf.config.attn_logit_softcapping
        stored = np.asarray(f.tensors["blk.0.post_ffw_norm.weight"].data, dtype=np.float32)
        w = hf.model.layers[0].post_feedforward_layernorm.weight.detach().numpy()
        np.testing.assert_allclose(stored, w + 1, atol=1e-6, rtol=0)  # NOTE [gemma gguf norms]
    model, tok = load_gguf(path)
    assert isinstance(model, Gemma2ForCausalLM) and model.weights_scheme is None and tok is not None
    assert model.config.layer_types == tuple(hf.config.layer_types)
    got = logits_of(model, IDS)
    np.testing.assert_allclose(got, _hf_logits(hf, IDS), atol=1e-4, rtol=0)
    np.testing.assert_allclose(got, logits_of(from_pretrained(d), IDS), atol=1e-5, rtol=0)
    from family_parity import hf_greedy

    assert model.generate(IDS[:12], 16) == hf_greedy(hf, IDS[:12], 16)


def test_llama_quantize_q8_0_file(checkpoint: fg.Checkpoint) -> None:
    d, hf = checkpoint
    tool = llama_cpp_tools.require_tool("llama-quantize")
    src = fg.convert(d, d / "converted-f32.gguf")
    out = d / "q8_0.gguf"
    if not out.exists():
        r = subprocess.run(
            [tool, str(src), str(out), "Q8_0"], capture_output=True, text=True, errors="replace", timeout=300
        )
        assert r.returncode == 0, r.stderr[-2000:]
    model, _ = load_gguf(out)
    assert isinstance(model, Gemma2ForCausalLM) and model.weights_scheme == "q8_0"
    got = logits_of(model, IDS)
    np.testing.assert_allclose(got, logits_of(from_pretrained(d, weights="q8_0"), IDS), atol=1e-5, rtol=0)
    want = _hf_logits(hf, IDS)
    assert float(np.abs(got - want).max()) < Q8_0_TOLERANCE[0]
    assert float((got.argmax(-1) == want.argmax(-1)).mean()) >= Q8_0_TOLERANCE[1]


def _tokenizer(d: Path) -> Any:
    """A byte-level BPE tokenizer of the model's vocabulary size (kael writes those to GGUF, not SentencePiece)."""
    return load_tokenizer(d / "bpe")


def test_save_gguf_round_trip(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    d, _ = checkpoint
    model = from_pretrained(d)
    path = tmp_path / "kael-gemma2.gguf"
    save_gguf(model, path, _tokenizer(d))
    with kael.io.read_gguf(path) as f:
        assert f.metadata["general.architecture"] == "gemma2"
        assert f.metadata["gemma2.final_logit_softcapping"] == model.config.final_logit_softcapping
        stored = np.asarray(f.tensors["output_norm.weight"].data, dtype=np.float32)
        np.testing.assert_array_equal(stored, model.model.norm.weight.detach().numpy() + np.float32(1))
    back, _ = load_gguf(path)
    assert isinstance(back, Gemma2ForCausalLM)
    np.testing.assert_allclose(logits_of(back, IDS), logits_of(model, IDS), atol=1e-6, rtol=0)
    q8 = tmp_path / "kael-gemma2-q8_0.gguf"
    save_gguf(model, q8, weights="q8_0")
    np.testing.assert_allclose(
        logits_of(load_gguf(q8)[0], IDS), logits_of(from_pretrained(d, weights="q8_0"), IDS), atol=1e-5, rtol=0
    )


def test_llama_cpp_runs_kaels_file_with_the_same_logits(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    """llama.cpp runs kael's F32 file: within 1e-2 (its CPU GELU reads a float16 table), the same argmax."""
    llama_cpp = pytest.importorskip("llama_cpp", reason=llama_cpp_tools.SKIP_REASON + ": no llama_cpp package")
    d, _ = checkpoint
    model = from_pretrained(d)
    path = tmp_path / "kael-gemma2.gguf"
    save_gguf(model, path, _tokenizer(d))
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=128, verbose=False, type_k=0, type_v=0)
    llm.eval(IDS)
    theirs = np.asarray(llm.scores[: len(IDS)], dtype=np.float32)
    ours = logits_of(model, IDS)
    assert float(np.abs(theirs - ours).max()) < 1e-2
    assert (theirs.argmax(-1) == ours.argmax(-1)).all()


def test_a_gemma2_file_without_a_post_attention_norm_is_refused(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    d, _ = checkpoint
    path = tmp_path / "kael-gemma2.gguf"
    save_gguf(from_pretrained(d), path)
    bad = rewrite(path, tmp_path / "bad.gguf", drop=("blk.1.post_attention_norm.weight",))
    with pytest.raises(kael.FormatError, match=r"missing tensor\(s\) \['blk\.1\.post_attention_norm\.weight'\]"):
        load_gguf(bad)


def test_llama_cpp_agrees_on_the_q8_0_file(checkpoint: fg.Checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """As fg.check_llama_cpp_agrees_on_q8_0, where llama.cpp's CPU GELU reads a float16 table: with kael's
    float32 GELU 288 ("gqa") and 285 ("mqa-window8") of 288 top tokens measured the same; with the table's
    rounding in kael (KAEL_GELU=ggml, NOTE [ggml GELU table]) 288 of 288 on both, within Q8_0_LLAMA_CPP_BOUNDS."""
    fg.check_llama_cpp_agrees_on_q8_0(checkpoint, monkeypatch, (0.03, 0.96))
    monkeypatch.setenv("KAEL_GELU", "ggml")
    fg.check_llama_cpp_agrees_on_q8_0(checkpoint, monkeypatch)
