"""GGUF files mixed as llama.cpp's llama-quantize writes them load as they are (kael/models/_gguf.py, #28).

A random Llama (256 wide, so every K-quant fits a row) is exported to F32 GGUF by kael, then
rewritten the way llama-quantize mixes a file: a Q4_0 file with a Q6_K token table and head, a
"Q4_K_M-like" file (Q4_K projections, Q6_K for attn_v/ffn_down/head, F32 norms) and a file with
every other block type (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS). The blocks are
random but valid (``kael.testing.weight_blocks``). Oracles:

* the ``gguf`` package: a twin file whose tensors are ``gguf.quants.dequantize`` of the same
  blocks, in F32; kael's logits on the mixed file equal its logits on the twin within float32
  summation noise (the kernels add in another order than a float32 matmul);
* the bytes: every quantized projection and table holds the file's blocks unchanged (never
  re-quantized on load), in its own format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kael
import numpy as np
import pytest
from hf_fixtures import write_llama3
from kael.models import from_pretrained, load_gguf, save_gguf
from kael.quant import QuantizedLinear
from kael.testing import weight_blocks
from kael.tokenizer import load_tokenizer
from llama_checkpoints import build

#: float oracles (NumPy, float64): quantized linears on float32 activations (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("float_activations_module")

gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")
pytest.importorskip("transformers")

SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2}
MIXES: dict[str, dict[str, str]] = {
    # llama-quantize ... q4_0: Q4_0 everywhere, the token table (and head) Q6_K
    "q4_0": {"token_embd": "Q6_K", "head": "Q6_K", "": "Q4_0"},
    # Q4_K_M: Q6_K for attn_v and ffn_down (some layers) and the head, Q4_K elsewhere
    "q4_k_m": {"token_embd": "Q4_K", "head": "Q6_K", "attn_v": "Q6_K", "ffn_down": "Q6_K", "": "Q4_K"},
    "others": {
        "token_embd": "IQ4_XS",
        "head": "Q5_K",
        "attn_q": "Q4_1",
        "attn_k": "Q5_0",
        "attn_v": "Q5_1",
        "attn_output": "Q2_K",
        "ffn_gate": "Q3_K",
        "ffn_up": "IQ4_NL",
        "ffn_down": "Q5_K",
        "": "Q4_K",
    },  # fmt: skip
}


def _type_for(name: str, mix: dict[str, str]) -> str:
    """The mix's type for a tensor: "head" is output.weight, other keys match a part of the name, "" the rest."""
    if name == "output.weight":
        return mix["head"]
    return next((t for key, t in mix.items() if key not in ("", "head") and key in name), mix[""])


@pytest.fixture(scope="module")
def f32_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("mixed")
    write_llama3(d)
    build(d, "llama", vocab_size=load_tokenizer(d).vocab_size, tie_word_embeddings=False, **SHAPE)
    path = d / "model-f32.gguf"
    save_gguf(from_pretrained(d), path, load_tokenizer(d))
    return path


def _mixed(src: Path, dst: Path, twin: Path, mix: dict[str, str]) -> dict[str, tuple[str, np.ndarray]]:
    """Write `dst` (2-D weights in the mix's types, random valid blocks) and `twin` (the same, dequantized)."""
    rng = np.random.default_rng(7)
    blocks: dict[str, tuple[str, np.ndarray]] = {}
    with kael.io.read_gguf(src) as f:
        meta = {k: kael.io.GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items() if "alignment" not in k}
        mixed, plain = [], []
        for name, t in f.tensors.items():
            data = np.array(t.data)
            if len(t.shape) == 2 and name.endswith(".weight"):
                kind = _type_for(name, mix)
                raw = weight_blocks(kind.lower(), t.shape[0], t.shape[1], rng, limit=0.5)
                values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).astype(np.float32)
                mixed.append((name, kind, t.shape, raw))
                plain.append((name, "F32", t.shape, values))
                blocks[name] = (kind, raw)
            else:
                mixed.append((name, t.type, t.shape, data))
                plain.append((name, t.type, t.shape, data))
        kael.io.write_gguf(dst, meta, mixed)
        kael.io.write_gguf(twin, meta, plain)
    return blocks


def _logits(model: Any, ids: list[int]) -> np.ndarray:
    with kael.no_grad():
        return np.asarray(model(kael.tensor([ids]))._host()[0], dtype=np.float64)


@pytest.mark.parametrize("mix", list(MIXES))
def test_a_mixed_file_loads_as_it_is_mixed(f32_file: Path, tmp_path: Path, mix: str) -> None:
    blocks = _mixed(f32_file, tmp_path / "mixed.gguf", tmp_path / "twin.gguf", MIXES[mix])
    model = load_gguf(tmp_path / "mixed.gguf")[0]
    twin = load_gguf(tmp_path / "twin.gguf")[0]
    schemes = {m.scheme for m in model.modules() if isinstance(m, QuantizedLinear)}
    assert schemes == {kind.lower() for name, (kind, _) in blocks.items() if "token_embd" not in name}
    if mix == "others":  # every block type of the registry is in this file
        want = {"IQ4_XS", "Q5_K", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "IQ4_NL"}
        assert {kind for kind, _ in blocks.values()} == want
    ids = [1, 17, 200, 5, 99, 3, 64, 250]
    got, want = _logits(model, ids), _logits(twin, ids)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * scale)
    assert np.array_equal(got.argmax(-1), want.argmax(-1))


def test_blocks_are_used_as_they_are(f32_file: Path, tmp_path: Path) -> None:
    """No re-quantization on load: each module holds the file's bytes, and saving writes them back."""
    blocks = _mixed(f32_file, tmp_path / "mixed.gguf", tmp_path / "twin.gguf", MIXES["others"])
    model = load_gguf(tmp_path / "mixed.gguf")[0]
    save_gguf(model, tmp_path / "again.gguf")
    with kael.io.read_gguf(tmp_path / "again.gguf") as f:
        for name, (kind, raw) in blocks.items():
            t = f.tensors[name]
            assert t.type == kind, name
            if "attn_q" in name or "attn_k" in name:
                continue  # rows permuted back and forth by the rope order: compared as a multiset below
            np.testing.assert_array_equal(np.asarray(t.data), raw, err_msg=name)
        q = f.tensors["blk.0.attn_q.weight"]
        assert sorted(map(bytes, np.asarray(q.data))) == sorted(map(bytes, blocks["blk.0.attn_q.weight"][1]))


def test_a_k_quant_row_that_is_not_whole_blocks_is_refused(f32_file: Path, tmp_path: Path) -> None:
    """A Q4_K tensor whose rows are 64 values (not a multiple of 256) is a FormatError naming it and the rule."""
    with kael.io.read_gguf(f32_file) as f:
        meta = {k: kael.io.GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items() if "alignment" not in k}
        tensors = [(n, t.type, t.shape, np.array(t.data)) for n, t in f.tensors.items()]
    bad = [(n, k, s, d) for n, k, s, d in tensors if n != "blk.0.attn_k.weight"]
    bad.append(("blk.0.attn_k.weight", "Q8_0", (128, 256), np.zeros((128, 272), np.uint8)))
    kael.io.write_gguf(tmp_path / "ok-types.gguf", meta, bad)
    load_gguf(tmp_path / "ok-types.gguf")  # Q8_0 in 32-value blocks fits
    with pytest.raises((kael.FormatError, kael.ShapeError), match=r"256|whole|multiple"):
        kael.io.write_gguf(
            tmp_path / "bad.gguf",
            meta,
            [*bad[:-1], ("blk.0.attn_k.weight", "Q4_K", (128, 64), np.zeros((128, 36), np.uint8))],
        )
        load_gguf(tmp_path / "bad.gguf")
