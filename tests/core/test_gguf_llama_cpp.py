"""GGUF models against llama.cpp (kael/models/_gguf*.py): the files kael writes, read by llama.cpp (the
``llama_cpp`` package: logits and tokenizer), and the files llama.cpp's own converter writes
(convert_hf_to_gguf.py from a llama.cpp source tree, found by tests/llama_cpp_tools.py), read by kael. The
checkpoints are the bundled kael-tiny-chat, a random GPT-2 with GPT-2's real vocabulary and random Llamas with a
Llama-3-style tokenizer (one with Llama 3.1's rope scaling, which the converter writes as a rope_freqs tensor).
llama.cpp computes F32 GELU through a float16 table and quantizes activations to Q8 for its Q8_0/Q4_0 (and
F16/BF16) dot products, so its logits differ from kael's (which keep activations float32) by the tolerances
measured for ``LLAMA_CPP_TOLERANCE`` below.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import kael
import llama_cpp_tools
import numpy as np
import pytest
from gguf_models_common import CONVERT as _CONVERT
from gguf_models_common import KAEL_TINY_CHAT, SCHEMES, TEXT
from gguf_models_common import export as _export
from gguf_models_common import logits_of as _logits
from gguf_models_common import rewrite as _rewrite
from hf_fixtures import write_llama3
from kael.models import from_pretrained, load_gguf, save_gguf
from kael.tokenizer import BpeTokenizer, load_tokenizer
from llama_checkpoints import build

pytest.importorskip("gguf")
pytest.importorskip("torch")
pytest.importorskip("transformers")


# -- llama.cpp ---------------------------------------------------------------------------------------

# (max |kael - llama.cpp| logit difference, least top-1 agreement): measured on these files
# (kael-tiny-chat, the random GPT-2) with margin; llama.cpp's F32 KV cache is asked for.
LLAMA_CPP_TOLERANCE: dict[str | None, tuple[float, float]] = {
    None: (1e-3, 1.0),
    "f16": (0.02, 1.0),
    "bf16": (0.1, 1.0),
    "q8_0": (0.3, 0.9),
    "q4_0": (0.3, 0.9),
}


@pytest.fixture(scope="module")
def chat_dir(root: Path) -> Path:
    d = root / "kael-tiny-chat"
    shutil.copytree(KAEL_TINY_CHAT, d)
    return d


@pytest.mark.parametrize("weights", SCHEMES)
@pytest.mark.parametrize("which", ["kael-tiny-chat", "gpt2"])
def test_llama_cpp_agrees(request: pytest.FixtureRequest, which: str, weights: str | None) -> None:
    llama_cpp = pytest.importorskip("llama_cpp", reason=llama_cpp_tools.SKIP_REASON + ": no llama_cpp package")
    d = request.getfixturevalue("chat_dir" if which == "kael-tiny-chat" else "gpt2_dir")
    path = _export(d, weights)
    model, tok = load_gguf(path)
    text = "def add(a, b):\n    return a + b\n\nclass Point:\n    def __repr__(self):"
    ids = tok.encode(text)
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=128, verbose=False, type_k=0, type_v=0)
    assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids
    llm.eval(ids)
    theirs = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
    ours = _logits(model, ids)
    diff = float(np.abs(theirs - ours).max())
    top1 = float((theirs.argmax(-1) == ours.argmax(-1)).mean())
    print(f"llama.cpp {which} {weights or 'f32'}: max |diff| {diff:.4g}, top-1 agreement {top1:.3f}")
    atol, agree = LLAMA_CPP_TOLERANCE[weights]
    assert diff <= atol and top1 >= agree, (diff, top1)


@pytest.mark.parametrize("which", ["kael-tiny-chat", "gpt2", "llama3-vocab"])
def test_llama_cpp_tokenizes_as_kael(request: pytest.FixtureRequest, root: Path, which: str) -> None:
    llama_cpp = pytest.importorskip("llama_cpp", reason=llama_cpp_tools.SKIP_REASON + ": no llama_cpp package")
    if which == "llama3-vocab":  # a regex split, then byte-level BPE (tokenizer.ggml.pre 'llama-bpe')
        d = root / "llama3-vocab"
        if not d.exists():
            write_llama3(d)
            build(d, "llama", vocab_size=load_tokenizer(d).vocab_size)
    else:
        d = request.getfixturevalue("chat_dir" if which == "kael-tiny-chat" else "gpt2_dir")
    path = _export(d, None)
    _, tok = load_gguf(path)
    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    texts = [
        TEXT,
        "  runs   of spaces\n\n\ttabs\r\n",
        "Ünïcödé tëxt, emoji 🙂🚀, 中文字符 and русский текст.",
        "I'm sure you're right; they'll see we've done it, she'd say. 1234567",
        "<|im_start|>user\nhi<|im_end|>\n",
    ]
    for text in texts:
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == tok.encode(text, add_special_tokens=False)
        assert llm.detokenize(tok.encode(text, add_special_tokens=False), special=True).decode() == text


# -- files written by llama.cpp's own converter (optional: KAEL_LLAMA_CPP_DIR, a llama.cpp source tree) --


@pytest.mark.parametrize("outtype", ["f32", "bf16", "q8_0"])
@pytest.mark.parametrize("which", ["gpt2", "kael-tiny-chat", "llama-untied"])
def test_llama_cpp_converter_files_load(
    request: pytest.FixtureRequest, root: Path, tmp_path: Path, which: str, outtype: str
) -> None:
    import json
    import subprocess
    import sys

    src = str(llama_cpp_tools.require_source())
    if which == "llama-untied":
        d = root / "llama3-vocab"
        if not d.exists():
            write_llama3(d)
            build(d, "llama", vocab_size=load_tokenizer(d).vocab_size)
    else:
        d = request.getfixturevalue("chat_dir" if which == "kael-tiny-chat" else "gpt2_dir")
    config = json.loads((d / "config.json").read_text())
    if config["model_type"] == "gpt2" and "n_ctx" not in config:  # the converter reads n_ctx
        (d / "config.json").write_text(json.dumps({**config, "n_ctx": config["n_positions"]}))
    out = tmp_path / f"{which}-{outtype}.gguf"
    pre = "llama-bpe" if which == "llama-untied" else "gpt-2"
    cmd = [sys.executable, "-c", _CONVERT, src, pre, str(d), "--outfile", str(out), "--outtype", outtype]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    model, tok = load_gguf(out)
    weights = None if outtype == "f32" else outtype
    assert model.weights_scheme == weights
    bpe = BpeTokenizer.from_directory(d) if which == "gpt2" else None
    ids = bpe.encode(TEXT, allowed_special="all") if bpe is not None else load_tokenizer(d).encode(TEXT)
    assert tok.encode(TEXT) == ids
    np.testing.assert_array_equal(_logits(model, ids), _logits(from_pretrained(d, weights=weights), ids))


def test_llama3_rope_freqs_from_llama_cpps_converter(root: Path, tmp_path: Path) -> None:
    """A Llama 3.1-style checkpoint (rope_scaling llama3, a context past the original): llama.cpp's converter
    writes its scaling as the rope_freqs tensor; kael's logits on that file equal transformers' on the
    checkpoint at positions past the original context, save_gguf writes the tensor back as it was read,
    and llama.cpp agrees on the same file."""
    import subprocess
    import sys

    import torch

    src = str(llama_cpp_tools.require_source())
    d = root / "llama31"
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    if not d.exists():
        write_llama3(d)
        build(d, "llama", vocab_size=load_tokenizer(d).vocab_size, rope_scaling=scaling, max_position_embeddings=256)
    out = tmp_path / "llama31.gguf"
    cmd = [sys.executable, "-c", _CONVERT, src, "llama-bpe", str(d), "--outfile", str(out), "--outtype", "f32"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    with kael.io.read_gguf(out) as f:
        factors = np.array(f.tensors["rope_freqs.weight"].data)
    # kept (short wavelengths), divided by the factor (long ones), and smoothed between
    assert factors.min() == 1.0 and factors.max() == 8.0 and ((factors > 1) & (factors < 8)).any(), factors
    model, tok = load_gguf(out)
    assert model.config.rope_freq_factors == tuple(float(x) for x in factors)
    ids = tok.encode(TEXT * 8)[:100]  # past the original context of 64
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    got = _logits(model, ids)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    plain = from_pretrained(d)  # the llama3 rope type computed from the config: the same frequencies
    np.testing.assert_allclose(_logits(plain, ids), got, rtol=1e-5, atol=1e-5)
    again = tmp_path / "again.gguf"
    save_gguf(model, again, tok)
    with kael.io.read_gguf(again) as f:
        np.testing.assert_array_equal(np.array(f.tensors["rope_freqs.weight"].data), factors)
    np.testing.assert_array_equal(_logits(load_gguf(again)[0], ids), got)
    with pytest.raises(kael.KaelError, match="rope_freqs tensor, which no Hugging Face rope type expresses"):
        model.save_pretrained(tmp_path / "hf")
    llama_cpp = pytest.importorskip("llama_cpp", reason=llama_cpp_tools.SKIP_REASON + ": no llama_cpp package")
    llm = llama_cpp.Llama(str(out), logits_all=True, verbose=False, n_ctx=256, n_threads=2)
    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)], np.float64)
    # llama.cpp keeps K/V in float16: its logits differ from kael's by a noise measured at 0.24% of the
    # largest logit here. Without the factors (plain rope) kael's would differ from its by far more.
    noise = np.abs(theirs - got).max() / np.abs(got).max()
    assert noise <= 5e-3, noise
    plain = _rewrite(out, tmp_path / "no-rope-freqs.gguf", drop=("rope_freqs.weight",))
    unscaled = np.abs(theirs - _logits(load_gguf(plain)[0], ids)).max() / np.abs(got).max()
    assert unscaled > 10 * noise, (unscaled, noise)
