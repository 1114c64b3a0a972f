"""GGUF models (kael/models/_gguf*.py) at the edges of loading and saving: malformed files are FormatErrors
naming the file (a missing, unexpected or misshapen tensor, unsupported metadata, an untied GPT-2 head, a token
list that does not match the table), ``save_gguf``'s refusals (a module that is no kael model, a
requantization), ``python -m kael export-gguf``, a loaded file saved again giving the same bytes (from CPU and
from CUDA), and a padded vocabulary's [PAD] tokens. The checkpoints are the bundled kael-tiny-chat, a random
GPT-2 with GPT-2's real vocabulary and a random Llama with a Llama-3-style tokenizer.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import kael
import llama_cpp_tools
import numpy as np
import pytest
from gguf_models_common import KAEL_TINY_CHAT, TEXT
from gguf_models_common import export as _export
from gguf_models_common import logits_of as _logits
from gguf_models_common import rewrite as _rewrite
from hf_fixtures import write_llama3
from kael.models import from_pretrained, load_gguf, save_gguf
from kael.tokenizer import load_tokenizer
from llama_checkpoints import build

pytest.importorskip("gguf")
pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def chat_dir(root: Path) -> Path:
    d = root / "kael-tiny-chat"
    shutil.copytree(KAEL_TINY_CHAT, d)
    return d


# -- errors ------------------------------------------------------------------------------------------


def test_malformed_files_are_format_errors(chat_dir: Path, gpt2_dir: Path, tmp_path: Path) -> None:
    good = _export(chat_dir, None)
    zeros = np.zeros((4, 4), np.float32)
    half = load_gguf(good)[0].config.dim // 2
    cases: list[tuple[dict[str, Any], str]] = [
        ({"drop": ("blk.1.attn_k.weight",)}, r"missing tensor\(s\) \['blk.1.attn_k.weight'\]"),
        ({"add": [("blk.9.attn_k.weight", "F32", (4, 4), zeros)]}, r"unexpected tensor\(s\) \['blk.9.attn_k.weight'\]"),
        (
            {"replace": {"blk.0.ffn_up.weight": ("F32", (352, 96), np.zeros((352, 96), np.float32))}},
            r"tensor 'blk.0.ffn_up.weight' has shape \[352, 96\], the config needs \[352, 128\]",
        ),
        (
            {"replace": {"blk.0.attn_norm.weight": ("I32", (128,), np.zeros(128, np.int32))}},
            "tensor 'blk.0.attn_norm.weight' has type I32",
        ),
        ({"meta": {"general.architecture": "falcon"}}, "general.architecture 'falcon' is not supported"),
        ({"meta": {"llama.block_count": None}}, "missing metadata key 'llama.block_count'"),
        ({"meta": {"llama.rope.dimension_count": kael.io.GGUFValue("uint32", 16)}}, "partial rotary"),
        ({"meta": {"llama.rope.scaling.type": "yarn"}}, "'yarn'"),
        (
            {"add": [("rope_freqs.weight", "F32", (3,), np.ones(3, np.float32))]},
            r"tensor 'rope_freqs.weight' must be F32 of shape \[\d+\] \(head_dim / 2\), got F32 \[3\]",
        ),
        (
            {"add": [("rope_freqs.weight", "F32", (half,), np.zeros(half, np.float32))]},
            "tensor 'rope_freqs.weight' must hold finite positive factors",
        ),
        ({"meta": {"tokenizer.ggml.model": "t5"}}, "'t5' vocabulary is not supported"),
    ]
    for i, (change, match) in enumerate(cases):
        bad = _rewrite(good, tmp_path / f"bad{i}.gguf", **change)
        with pytest.raises(kael.FormatError, match=match) as info:
            load_gguf(bad)
        assert str(bad) in str(info.value), info.value
    gpt2 = _export(gpt2_dir, None)
    with kael.io.read_gguf(gpt2) as f:
        table = np.array(f.tensors["token_embd.weight"].data)
    other = _rewrite(gpt2, tmp_path / "untied.gguf", add=[("output.weight", "F32", table.shape, table + 1)])
    with pytest.raises(kael.FormatError, match="untied GPT-2 LM head"):
        load_gguf(other)
    tied = _rewrite(gpt2, tmp_path / "tied.gguf", add=[("output.weight", "F32", table.shape, table)])
    assert load_gguf(tied)[0].config == load_gguf(gpt2)[0].config  # the same table again is accepted
    with pytest.raises(kael.FormatError, match="is not a file"):
        load_gguf(tmp_path / "missing.gguf")


def test_save_gguf_refusals(chat_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(kael.KaelError, match="expected a kael GPT or LlamaForCausalLM"):
        save_gguf(kael.nn.Linear(2, 2), tmp_path / "x.gguf")
    quantized = from_pretrained(chat_dir, weights="q8_0")
    with pytest.raises(kael.KaelError, match="would requantize"):
        save_gguf(quantized, tmp_path / "x.gguf", weights="q4_0")
    save_gguf(quantized, tmp_path / "q8.gguf")  # its own bytes, as they are
    model, tok = load_gguf(tmp_path / "q8.gguf")
    assert tok is None and model.weights_scheme == "q8_0"
    ids = [5, 6, 7, 8]
    np.testing.assert_array_equal(_logits(model, ids), _logits(quantized, ids))
    assert not (tmp_path / "x.gguf").exists()


def test_export_gguf_command(chat_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kael.__main__ import main

    out = tmp_path / "chat-q4.gguf"
    assert main(["export-gguf", str(chat_dir), str(out), "--weights", "q4_0"]) == 0
    assert "wrote" in capsys.readouterr().out
    model, tok = load_gguf(out)
    assert model.weights_scheme == "q4_0" and tok.chat_template is not None
    ids = tok.encode("def f(x):")
    np.testing.assert_array_equal(_logits(model, ids), _logits(from_pretrained(chat_dir, weights="q4_0"), ids))
    assert main(["export-gguf", str(tmp_path / "nothing"), str(out)]) == 1
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("weights", ["q4_0", "bf16"])
def test_saving_a_loaded_file_gives_the_same_bytes(chat_dir: Path, tmp_path: Path, weights: str) -> None:
    path = _export(chat_dir, weights)
    model, tok = load_gguf(path)
    again = tmp_path / "again.gguf"
    save_gguf(model, again, tok)
    assert again.read_bytes() == path.read_bytes()


@pytest.mark.parametrize("weights", ["q8_0", "q4_0", "bf16"])
def test_cuda_load_and_save(chat_dir: Path, tmp_path: Path, weights: str) -> None:
    try:
        kael.empty(1, device="cuda")
    except kael.KaelError:
        pytest.skip("no usable cuda device (a GPU, or KAEL_CUDA_EMULATE=1 for host emulation)")
    path = _export(chat_dir, weights)
    cpu, tok = load_gguf(path)
    gpu, _ = load_gguf(path, device="cuda")
    assert gpu.device.type == "cuda"
    ids = tok.encode("def add(a, b):")
    with kael.no_grad():
        got = np.asarray(gpu(kael.tensor([ids], device="cuda"))._host()[0])
    np.testing.assert_allclose(got, _logits(cpu, ids), rtol=0, atol=1e-4)
    again = tmp_path / "from-cuda.gguf"
    save_gguf(gpu, again, tok)
    assert again.read_bytes() == path.read_bytes()


def test_a_padded_vocabulary(root: Path, tmp_path: Path) -> None:
    """A table with more rows than the tokenizer has tokens gets unused [PAD] tokens (as the converter
    writes them), and a file whose token list does not match the table is refused."""
    d = root / "padded"
    if not d.exists():
        write_llama3(d)
        build(d, "llama", vocab_size=load_tokenizer(d).vocab_size + 7)
    tok = load_tokenizer(d)
    path = tmp_path / "padded.gguf"
    save_gguf(from_pretrained(d), path, tok)
    with kael.io.read_gguf(path) as f:
        tokens, types = f.metadata["tokenizer.ggml.tokens"], f.metadata["tokenizer.ggml.token_type"]
    assert len(tokens) == tok.vocab_size + 7 and tokens[-1] == f"[PAD{tok.vocab_size + 6}]" and types[-7:] == [5] * 7
    model, back = load_gguf(path)
    assert back.encode(TEXT) == tok.encode(TEXT)
    np.testing.assert_array_equal(_logits(model, tok.encode(TEXT)), _logits(from_pretrained(d), tok.encode(TEXT)))
    llama_cpp = pytest.importorskip("llama_cpp", reason=llama_cpp_tools.SKIP_REASON + ": no llama_cpp package")
    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    assert llm.tokenize(TEXT.encode(), add_bos=True, special=True) == tok.encode(TEXT)
    short = _rewrite(
        path,
        tmp_path / "short.gguf",
        meta={
            "tokenizer.ggml.tokens": kael.io.GGUFValue("array[string]", tokens[:-1]),
            "tokenizer.ggml.token_type": kael.io.GGUFValue("array[int32]", types[:-1]),
        },
    )
    with pytest.raises(kael.FormatError, match=r"tokenizer.ggml.tokens has \d+ tokens, the model's vocabulary"):
        load_gguf(short)
