"""GGUF models (kael/models/_gguf*.py): ``load_gguf``, ``save_gguf``, ``from_pretrained("x.gguf")``.

Random-weight GPT-2, Llama (untied head, grouped-query) and Qwen2 (q/k/v biases, tied)
checkpoints are built offline with transformers; kael exports each to GGUF in F32, F16,
BF16, Q8_0 and Q4_0. Oracles:

* kael's own quantized model (``from_pretrained(dir, weights=...)``): the GGUF file loaded
  back gives the same logits, bit for bit (the same bytes in the same modules);
* the ``gguf`` package: the file's tensors are what llama.cpp's converter makes of the
  transformers weights (GPT-2's Conv1D transposed, Llama's q/k rows permuted by the
  converter's own formula, quantized by ``gguf.quants.quantize``), byte for byte;
* transformers, which loads the GGUF file itself (``gguf_file=``, dequantizing through
  the gguf package): its logits on the same file within 1e-4 of kael's;
* llama.cpp (``llama_cpp``, when installed): logits on the same file, and its tokenizer.
  llama.cpp computes F32 GELU through a float16 table and quantizes activations to Q8 for
  its Q8_0/Q4_0 (and F16/BF16) dot products, so its logits differ from kael's (which keep
  activations float32) by the tolerances measured for ``LLAMA_CPP_TOLERANCE`` below.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import kael
import llama_cpp_tools
import numpy as np
import pytest
from hf_fixtures import GPT2_DATA, write_llama3
from hypothesis import given, settings
from hypothesis import strategies as st
from kael.models import from_pretrained, load_gguf, save_gguf
from kael.models._gguf import rope_rows
from kael.tokenizer import BpeTokenizer, load_tokenizer
from llama_checkpoints import build

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SCHEMES = (None, "f16", "bf16", "q8_0", "q4_0")
TYPES = {None: "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0"}
TEXT = "The quick brown fox, 12345 apples; it's <|endoftext|> done."
KAEL_TINY_CHAT = (
    Path(__file__).resolve().parents[2] / "kael_server" / "src" / "kael_server" / "models" / "kael-tiny-chat"
)


def _logits(model: Any, ids: list[int]) -> np.ndarray:
    with kael.no_grad():
        return np.asarray(model(kael.tensor([ids]))._host()[0])


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf-models")


@pytest.fixture(scope="module")
def gpt2_dir(root: Path) -> Path:
    """A random GPT-2 (2 layers, 64 wide) with GPT-2's real vocabulary (n_positions 1024: transformers'
    GGUF loader does not read gpt2.context_length into n_positions)."""
    d = root / "gpt2"
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=2, n_positions=1024, vocab_size=50257)
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(d)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(GPT2_DATA / name, d / name)
    return d


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def llama_dir(request: pytest.FixtureRequest, root: Path) -> Path:
    """A random Llama (untied head) or Qwen2 (biases, tied) with a Llama-3-style tokenizer."""
    d = root / request.param
    write_llama3(d)
    tied = request.param == "qwen2"
    build(d, request.param, vocab_size=load_tokenizer(d).vocab_size, tie_word_embeddings=tied)
    return d


def _export(directory: Path, weights: str | None) -> Path:
    path = directory / f"model-{weights or 'f32'}.gguf"
    if not path.exists():
        save_gguf(from_pretrained(directory), path, load_tokenizer(directory), weights=weights)
    return path


# -- the converter's row order ---------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3))
def test_rope_rows_undo_the_converters_permute(heads: int, half: int, cols: int) -> None:
    rows = heads * 2 * half
    hf = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    # convert_hf_to_gguf.py's LlamaModel.permute, written out with NumPy
    gg = hf.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(hf.shape)
    perm = rope_rows(rows, heads)
    np.testing.assert_array_equal(gg[perm], hf)
    np.testing.assert_array_equal(hf[np.argsort(perm)], gg)


# -- kael's own quantized model ----------------------------------------------------------------------


@pytest.mark.parametrize("weights", SCHEMES)
def test_gpt2_round_trip_is_kaels_quantized_model(gpt2_dir: Path, weights: str | None) -> None:
    path = _export(gpt2_dir, weights)
    model, tok = load_gguf(path)
    assert isinstance(model, kael.models.GPT) and model.weights_scheme == weights
    ids = BpeTokenizer.from_directory(gpt2_dir).encode(TEXT, allowed_special="all")
    assert tok.encode(TEXT) == ids
    want = _logits(from_pretrained(gpt2_dir, weights=weights), ids)
    np.testing.assert_array_equal(_logits(model, ids), want)


@pytest.mark.parametrize("weights", SCHEMES)
def test_llama_round_trip_is_kaels_quantized_model(llama_dir: Path, weights: str | None) -> None:
    path = _export(llama_dir, weights)
    model, tok = load_gguf(path)
    reference = from_pretrained(llama_dir, weights=weights)
    assert model.config.model_type == reference.config.model_type
    assert model.config.tie_word_embeddings == reference.config.tie_word_embeddings
    assert model.weights_scheme == weights
    ids = load_tokenizer(llama_dir).encode(TEXT)
    assert tok.encode(TEXT) == ids
    np.testing.assert_array_equal(_logits(model, ids), _logits(reference, ids))
    if weights is not None:
        proj = model.model.layers[0].self_attn.q_proj
        assert isinstance(proj, kael.quant.QuantizedLinear) and proj.scheme == weights


def test_mmap_and_from_pretrained(llama_dir: Path) -> None:
    path = _export(llama_dir, "q8_0")
    ids = load_tokenizer(llama_dir).encode(TEXT)
    copied, _ = load_gguf(path)
    mapped, _ = load_gguf(path, mmap=True)
    via = from_pretrained(path)
    want = _logits(copied, ids)
    np.testing.assert_array_equal(_logits(mapped, ids), want)
    np.testing.assert_array_equal(_logits(via, ids), want)
    assert via.generation_config.eos_token_ids == (load_tokenizer(llama_dir).eos_token_id,)


def test_weights_choice_on_gguf_files(llama_dir: Path) -> None:
    f32 = _export(llama_dir, None)
    ids = load_tokenizer(llama_dir).encode(TEXT)
    model, _ = load_gguf(f32, weights="q4_0")
    assert model.weights_scheme == "q4_0"
    np.testing.assert_array_equal(_logits(model, ids), _logits(from_pretrained(llama_dir, weights="q4_0"), ids))
    with pytest.raises(kael.KaelError, match="requantize"):
        load_gguf(_export(llama_dir, "q8_0"), weights="q4_0")
    with pytest.raises(kael.KaelError, match="weights must be"):
        load_gguf(f32, weights="q7_k")
    with pytest.raises(kael.DTypeError, match="float32"):
        from_pretrained(f32, dtype=kael.float16)


# -- the gguf package: the file is what llama.cpp's converter writes ----------------------------------


def _converter_permute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _quantized(a: np.ndarray, kind: str) -> np.ndarray:
    if kind == "F32":
        return a.astype(np.float32)
    if kind == "F16":
        return a.astype(np.float16).view(np.uint8)
    return np.asarray(gguf.quants.quantize(a.astype(np.float32), gguf.GGMLQuantizationType[kind]))


@pytest.mark.parametrize("weights", ["q8_0", "q4_0", "f16"])
def test_file_holds_the_converters_tensors(llama_dir: Path, gpt2_dir: Path, weights: str) -> None:
    """Every projection's bytes, read by gguf.GGUFReader, are the transformers weight laid out as the
    converter lays it out and quantized by gguf.quants (independently of kael)."""
    kind = TYPES[weights]
    for d in (llama_dir, gpt2_dir):
        path = _export(d, weights)
        hf = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
        sd = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
        cfg = hf.config
        if cfg.model_type == "gpt2":
            expect = {
                "blk.0.attn_qkv.weight": sd["transformer.h.0.attn.c_attn.weight"].T,
                "blk.1.ffn_down.weight": sd["transformer.h.1.mlp.c_proj.weight"].T,
            }
            table = "transformer.wte.weight"
        else:
            permute = cfg.model_type == "llama"
            q, k = sd["model.layers.1.self_attn.q_proj.weight"], sd["model.layers.1.self_attn.k_proj.weight"]
            expect = {
                "blk.1.attn_q.weight": _converter_permute(q, cfg.num_attention_heads) if permute else q,
                "blk.1.attn_k.weight": _converter_permute(k, cfg.num_key_value_heads) if permute else k,
                "blk.0.ffn_down.weight": sd["model.layers.0.mlp.down_proj.weight"],
            }
            table = "model.embed_tokens.weight"
        reader = gguf.GGUFReader(str(path))
        tensors = {t.name: t for t in reader.tensors}
        for name, w in expect.items():
            t = tensors[name]
            assert t.tensor_type.name == kind, name
            got = np.asarray(t.data).reshape(-1).view(np.uint8)
            np.testing.assert_array_equal(got, _quantized(np.ascontiguousarray(w), kind).reshape(-1).view(np.uint8))
        # the token table: Q8_0 under q4_0 when it is the (tied) head, as llama.cpp's default choice
        emb = tensors["token_embd.weight"].tensor_type.name
        tied = cfg.model_type == "gpt2" or cfg.tie_word_embeddings
        assert emb == ("Q8_0" if weights == "q4_0" and tied else kind), (d.name, emb)
        assert table in sd
        field = reader.fields["general.architecture"]
        assert bytes(field.parts[field.data[0]]).decode() == ("llama" if cfg.model_type == "llama" else cfg.model_type)


# -- transformers reads the same file --------------------------------------------------------------


@pytest.mark.parametrize("weights", SCHEMES)
def test_transformers_reads_kaels_llama_file(llama_dir: Path, weights: str | None) -> None:
    pytest.importorskip("accelerate")  # transformers needs it to load a GGUF file
    path = _export(llama_dir, weights)
    model, tok = load_gguf(path)
    ids = tok.encode(TEXT)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        want = hf.eval()(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(_logits(model, ids), want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("weights", [None, "q4_0"])
def test_transformers_reads_kaels_gpt2_file(gpt2_dir: Path, weights: str | None) -> None:
    pytest.importorskip("accelerate")
    path = _export(gpt2_dir, weights)
    model, tok = load_gguf(path)
    ids = tok.encode(TEXT)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        want = hf.eval()(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(_logits(model, ids), want, rtol=0, atol=1e-4)


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


# -- errors ------------------------------------------------------------------------------------------


def _rewrite(
    src: Path,
    dst: Path,
    *,
    meta: dict[str, Any] | None = None,
    drop: tuple[str, ...] = (),
    add: list[tuple[str, str, tuple[int, ...], np.ndarray]] | None = None,
    replace: dict[str, tuple[str, tuple[int, ...], np.ndarray]] | None = None,
) -> Path:
    with kael.io.read_gguf(src) as f:
        metadata: dict[str, Any] = {
            k: kael.io.GGUFValue(f.metadata_types[k], v)
            for k, v in f.metadata.items()
            if not k.startswith("general.alignment")
        }
        for k, v in (meta or {}).items():
            if v is None:
                metadata.pop(k, None)
            else:
                metadata[k] = v
        tensors = []
        for name, t in f.tensors.items():
            if name in drop:
                continue
            if replace and name in replace:
                kind, shape, data = replace[name]
                tensors.append((name, kind, shape, data))
            else:
                tensors.append((name, t.type, t.shape, np.array(t.data)))
        tensors += add or []
        kael.io.write_gguf(dst, metadata, tensors)
    return dst


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


# -- files written by llama.cpp's own converter (optional: KAEL_LLAMA_CPP_DIR, a llama.cpp source tree) --

_CONVERT = """
import sys
root, pre = sys.argv[1], sys.argv[2]
sys.path[:0] = [root, root + "/gguf-py"]
import convert_hf_to_gguf as c
try:
    import conversion.base as b
except ImportError:
    b = c
# llama.cpp names a tokenizer's pre-tokenizer by hashing known tokenizers' output; these test
# tokenizers are not in its table, so the test tells it which split they use.
b.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[3:]]
c.main()
"""


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
