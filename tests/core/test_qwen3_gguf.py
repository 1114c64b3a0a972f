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

import subprocess
import sys
from pathlib import Path
from typing import Any

import kael
import llama_cpp_tools
import numpy as np
import pytest
from gguf_models_common import CONVERT as _CONVERT
from gguf_models_common import TEXT, logits_of, rewrite
from hf_fixtures import write_llama3
from kael.models import from_pretrained, load_gguf, save_gguf
from kael.models.qwen3 import Qwen3ForCausalLM
from kael.tokenizer import load_tokenizer
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


def _text_ids(d: Path) -> list[int]:
    ids: list[int] = load_tokenizer(d).encode(TEXT * 2)
    return ids


@pytest.fixture(scope="module", params=list(SHAPES))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """(directory, transformers model): a random Qwen3 with a Llama-3-style tokenizer (hf_fixtures)."""
    d = tmp_path_factory.mktemp(f"qwen3-{request.param}")
    write_llama3(d)
    hf = build(d, seed=4, vocab_size=load_tokenizer(d).vocab_size, **SHAPES[request.param])
    return d, hf


def _convert(d: Path, out: Path) -> Path:
    src = str(llama_cpp_tools.require_source())
    if not out.exists():
        cmd = [sys.executable, "-c", _CONVERT, src, "llama-bpe", str(d), "--outfile", str(out), "--outtype", "f32"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    return out


def _hf_logits(hf: Any, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        out: np.ndarray = hf(torch.tensor([ids])).logits[0].numpy()
    return out


def test_converter_f32_file_matches_transformers(checkpoint: tuple[Path, Any]) -> None:
    d, hf = checkpoint
    path = _convert(d, d / "converted-f32.gguf")
    with kael.io.read_gguf(path) as f:
        assert f.metadata["general.architecture"] == "qwen3"
        assert "blk.1.attn_k_norm.weight" in f.tensors
        assert ("output.weight" in f.tensors) != hf.config.tie_word_embeddings
    model, tok = load_gguf(path)
    assert isinstance(model, Qwen3ForCausalLM) and model.weights_scheme is None
    assert model.config.dim == hf.config.head_dim and model.config.qk_norm
    ids = _text_ids(d)
    assert tok.encode(TEXT * 2) == ids
    got = logits_of(model, ids)
    np.testing.assert_allclose(got, _hf_logits(hf, ids), atol=1e-4, rtol=0)
    np.testing.assert_allclose(got, logits_of(from_pretrained(d), ids), atol=1e-5, rtol=0)
    # and through generate with the direct step: transformers' greedy tokens
    x = torch.tensor([ids[:12]])
    with torch.no_grad():
        want = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert model.generate(ids[:12], 16) == want[0, 12:].tolist()


def test_llama_quantize_q8_0_file(checkpoint: tuple[Path, Any]) -> None:
    d, hf = checkpoint
    tool = llama_cpp_tools.require_tool("llama-quantize")
    src = _convert(d, d / "converted-f32.gguf")
    out = d / "q8_0.gguf"
    if not out.exists():
        r = subprocess.run([tool, str(src), str(out), "Q8_0"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
    model, _ = load_gguf(out)
    assert isinstance(model, Qwen3ForCausalLM) and model.weights_scheme == "q8_0"
    ids = _text_ids(d)
    got = logits_of(model, ids)
    # llama-quantize and kael round Q8_0 blocks the same way (GGML's reference): kael's own q8_0 of the checkpoint
    np.testing.assert_allclose(got, logits_of(from_pretrained(d, weights="q8_0"), ids), atol=1e-5, rtol=0)
    want = _hf_logits(hf, ids)
    diff, top1 = float(np.abs(got - want).max()), float((got.argmax(-1) == want.argmax(-1)).mean())
    assert diff < Q8_0_TOLERANCE[0] and top1 >= Q8_0_TOLERANCE[1], (diff, top1)


def test_save_gguf_round_trip(checkpoint: tuple[Path, Any], tmp_path: Path) -> None:
    d, _ = checkpoint
    model = from_pretrained(d)
    path = tmp_path / "kael-qwen3.gguf"
    save_gguf(model, path, load_tokenizer(d))
    with kael.io.read_gguf(path) as f:
        assert f.metadata["general.architecture"] == "qwen3"
        assert f.tensors["blk.0.attn_q_norm.weight"].shape == (model.config.dim,)
        assert f.metadata["qwen3.attention.key_length"] == model.config.dim
    back, tok = load_gguf(path)
    ids = _text_ids(d)
    assert isinstance(back, Qwen3ForCausalLM) and tok.encode(TEXT * 2) == ids
    np.testing.assert_array_equal(logits_of(back, ids), logits_of(model, ids))
    q8 = tmp_path / "kael-qwen3-q8_0.gguf"
    save_gguf(model, q8, load_tokenizer(d), weights="q8_0")
    np.testing.assert_allclose(
        logits_of(load_gguf(q8)[0], ids), logits_of(from_pretrained(d, weights="q8_0"), ids), atol=1e-5, rtol=0
    )


def test_llama_cpp_runs_kaels_file_with_the_same_logits(checkpoint: tuple[Path, Any], tmp_path: Path) -> None:
    llama_cpp = pytest.importorskip("llama_cpp", reason=llama_cpp_tools.SKIP_REASON + ": no llama_cpp package")
    d, _ = checkpoint
    model = from_pretrained(d)
    path = tmp_path / "kael-qwen3.gguf"
    save_gguf(model, path, load_tokenizer(d))
    ids = _text_ids(d)
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=128, verbose=False, type_k=0, type_v=0)
    assert llm.tokenize((TEXT * 2).encode(), add_bos=True, special=True) == ids
    llm.eval(ids)
    theirs = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
    ours = logits_of(model, ids)
    # F32 weights and KV cache: float32 rounding in a different order (test_gguf_llama_cpp's F32 bound)
    assert float(np.abs(theirs - ours).max()) < 1e-3
    assert (theirs.argmax(-1) == ours.argmax(-1)).all()


def test_a_qwen3_file_without_its_q_norm_is_refused(checkpoint: tuple[Path, Any], tmp_path: Path) -> None:
    d, _ = checkpoint
    path = tmp_path / "kael-qwen3.gguf"
    save_gguf(from_pretrained(d), path)
    bad = rewrite(path, tmp_path / "bad.gguf", drop=("blk.1.attn_q_norm.weight",))
    with pytest.raises(kael.FormatError, match=r"missing tensor\(s\) \['blk\.1\.attn_q_norm\.weight'\]"):
        load_gguf(bad)
