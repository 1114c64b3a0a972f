"""GGUF models (kael/models/_gguf*.py): ``load_gguf``, ``save_gguf`` and ``from_pretrained("x.gguf")`` against
kael's own quantized model, the gguf package and transformers. Random-weight GPT-2, Llama (untied head,
grouped-query) and Qwen2 (q/k/v biases, tied) checkpoints are built offline with transformers; kael exports
each to GGUF in F32, F16, BF16, Q8_0 and Q4_0. Oracles: kael's own quantized model
(``from_pretrained(dir, weights=...)``), whose logits the GGUF file loaded back gives bit for bit (the same
bytes in the same modules); the ``gguf`` package, by which the file's tensors are what llama.cpp's converter
makes of the transformers weights (GPT-2's Conv1D transposed, Llama's q/k rows permuted by the converter's own
formula, quantized by ``gguf.quants.quantize``), byte for byte; and transformers, which loads the GGUF file
itself (``gguf_file=``, dequantizing through the gguf package) and whose logits on the same file are within
1e-4 of kael's. llama.cpp's own view of these files is in test_gguf_llama_cpp.py, saving and malformed files
in test_gguf_models_save_and_errors.py.
"""

from __future__ import annotations

from pathlib import Path

import kael
import numpy as np
import pytest
from gguf_models_common import SCHEMES, TEXT
from gguf_models_common import export as _export
from gguf_models_common import logits_of as _logits
from hf_fixtures import write_llama3
from hypothesis import given, settings
from hypothesis import strategies as st
from kael.models import from_pretrained, load_gguf
from kael.models._gguf import rope_rows
from kael.tokenizer import BpeTokenizer, load_tokenizer
from llama_checkpoints import build

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TYPES = {None: "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0"}


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def llama_dir(request: pytest.FixtureRequest, root: Path) -> Path:
    """A random Llama (untied head) or Qwen2 (biases, tied) with a Llama-3-style tokenizer."""
    d = root / request.param
    write_llama3(d)
    tied = request.param == "qwen2"
    build(d, request.param, vocab_size=load_tokenizer(d).vocab_size, tie_word_embeddings=tied)
    return d


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


@pytest.mark.usefixtures("float_activations")  # a float oracle (tests/conftest.py)
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


@pytest.mark.usefixtures("float_activations")  # a float oracle (tests/conftest.py)
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
