"""llama.cpp's quantization mixes (kael.quant.formats.mix_types) against ``llama-quantize`` itself.

Oracle 1: llama.cpp's ``llama-quantize`` (found through tests/llama_cpp_tools.py, skipped when absent)
quantizes two random F32 GGUF files that kael writes, and every tensor's type in its output must be
what ``mix_types`` says, for every mix: a 16-layer Llama (untied head, 8 heads over 2 K/V heads, so
GQA 4; FFN rows of 320 values, which no 256-value type fits) and a 12-layer Qwen2 (tied table as the
head, GQA 2, 160 wide, so every K-quant falls back and the head is Q8_0). The quantized tensors'
bytes equal kael's reference quantizers (REFERENCE_QUANTIZERS and the legacy rows) on the F32 rows.

Oracle 2 (no tool needed): expectations written from llama.cpp's ``src/llama-quant.cpp`` as vendored
by llama-cpp-python 0.3.36: ``use_more_bits`` (line 452), the output-head rule (lines 490-512), the
attn_v rules (lines 567-604: Q3_K_M's first two, Q4_K_S's first four, Q4_K_M/Q5_K_M's use_more_bits
layers), the ffn_down rules (lines 624-668), attn_output (lines 669-688), attn_qkv counted as attn_v
(lines 157-160, 567) and the fallbacks of ``tensor_type_fallback`` (lines 390-443); the tensors left
unquantized by ``tensor_allows_quantization`` (lines 287-383).
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import llama_cpp_tools
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kael import DTypeError, ShapeError
from kael.quant.formats import (
    MIXES,
    REFERENCE_QUANTIZERS,
    get_format,
    mix_base,
    mix_types,
    plan_base,
    use_more_bits,
)

gguf = pytest.importorskip("gguf")

_MODELS = {
    # family, config overrides
    "llama16": (
        "llama",
        {
            "hidden_size": 256,
            "intermediate_size": 320,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "num_hidden_layers": 16,
            "tie_word_embeddings": False,
        },
    ),
    "qwen12": (
        "qwen2",
        {
            "hidden_size": 160,
            "intermediate_size": 256,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 12,
            "tie_word_embeddings": True,
        },
    ),
}


@pytest.fixture(scope="module", params=list(_MODELS))
def f32_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A random model written by kael as F32 GGUF, with its head counts."""
    llama_cpp_tools.require_tool("llama-quantize")
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from hf_fixtures import write_llama3
    from kael.models import from_pretrained, save_gguf
    from kael.tokenizer import load_tokenizer
    from llama_checkpoints import build

    family, cfg = _MODELS[request.param]
    d = tmp_path_factory.mktemp(f"mix-{request.param}")
    write_llama3(d)
    build(d, family, vocab_size=load_tokenizer(d).vocab_size, **cfg)
    path = d / "f32.gguf"
    save_gguf(from_pretrained(d), path, load_tokenizer(d))
    return path, cfg


def _tensors(path: Path) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, NumPy-order shape, lower-case GGML type name) of every tensor, in file order."""
    reader = gguf.GGUFReader(str(path))
    return [(t.name, tuple(int(s) for s in reversed(t.shape)), t.tensor_type.name.lower()) for t in reader.tensors]


@pytest.mark.parametrize("mix", list(MIXES))
def test_types_equal_llama_quantize(f32_model: tuple[Path, dict], mix: str) -> None:
    src, cfg = f32_model
    out = src.with_name(f"{mix}.gguf")
    tool = llama_cpp_tools.require_tool("llama-quantize")
    r = subprocess.run([tool, str(src), str(out), mix.upper(), "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    before = _tensors(src)
    after = {name: kind for name, _, kind in _tensors(out)}
    plan = mix_types(
        mix,
        [(name, shape) for name, shape, _ in before],
        n_head=cfg["num_attention_heads"],
        n_head_kv=cfg["num_key_value_heads"],
        n_layer=cfg["num_hidden_layers"],
    )
    assert set(after) == set(plan)
    want = {name: plan[name] or kind for name, _, kind in before}
    assert after == want
    # and the bytes: kael's reference quantizers on the same F32 rows give llama-quantize's blocks
    src_data = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(src)).tensors}
    for t in gguf.GGUFReader(str(out)).tensors:
        kind = plan[t.name]
        if kind is None:
            continue
        x = src_data[t.name].reshape(-1, src_data[t.name].shape[-1])
        fmt = get_format(kind)
        quantize = fmt.quantize_blocks or REFERENCE_QUANTIZERS[kind]
        got = quantize(x.reshape(-1, fmt.block_values)).reshape(x.shape[0], -1)
        np.testing.assert_array_equal(got, np.asarray(t.data).reshape(got.shape), err_msg=t.name)
    out.unlink()


# -- expectations from llama-quant.cpp (no tool needed) ---------------------------------------------


def _llama(n_layer: int, width: int = 256, ffn: int = 512, tied: bool = False) -> list[tuple[str, tuple[int, ...]]]:
    t: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (1000, width))]
    for i in range(n_layer):
        t += [
            (f"blk.{i}.attn_norm.weight", (width,)),
            (f"blk.{i}.attn_q.weight", (width, width)),
            (f"blk.{i}.attn_k.weight", (width // 4, width)),
            (f"blk.{i}.attn_v.weight", (width // 4, width)),
            (f"blk.{i}.attn_output.weight", (width, width)),
            (f"blk.{i}.ffn_norm.weight", (width,)),
            (f"blk.{i}.ffn_gate.weight", (ffn, width)),
            (f"blk.{i}.ffn_up.weight", (ffn, width)),
            (f"blk.{i}.ffn_down.weight", (width, ffn)),
        ]
    t.append(("output_norm.weight", (width,)))
    if not tied:
        t.append(("output.weight", (1000, width)))
    return t


def test_use_more_bits_layers() -> None:
    """i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2 (integer division)."""
    assert [i for i in range(16) if use_more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]
    assert [i for i in range(30) if use_more_bits(i, 30)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
    assert [i for i in range(2) if use_more_bits(i, 2)] == [1]  # 2//8 = 0, 7*2//8 = 1


def test_q4_k_m_table() -> None:
    got = mix_types("q4_k_m", _llama(16), n_head=8, n_head_kv=2)
    more = {0, 1, 4, 7, 10, 13, 14, 15}
    for i in range(16):
        assert got[f"blk.{i}.attn_v.weight"] == ("q6_k" if i in more else "q4_k")
        assert got[f"blk.{i}.ffn_down.weight"] == ("q6_k" if i in more else "q4_k")
        assert got[f"blk.{i}.attn_q.weight"] == got[f"blk.{i}.ffn_up.weight"] == "q4_k"
        assert got[f"blk.{i}.attn_norm.weight"] is None
    assert got["output.weight"] == "q6_k" and got["token_embd.weight"] == "q4_k" and got["output_norm.weight"] is None


def test_k_s_l_and_q2_tables() -> None:
    t = _llama(16)
    s = mix_types("q4_k_s", t, n_head=8, n_head_kv=8)
    assert [s[f"blk.{i}.attn_v.weight"] for i in range(6)] == ["q5_k"] * 4 + ["q4_k"] * 2
    assert [s[f"blk.{i}.ffn_down.weight"] for i in range(3)] == ["q5_k", "q5_k", "q4_k"]  # i < 16/8
    m = mix_types("q3_k_m", t, n_head=8, n_head_kv=8)
    assert [m[f"blk.{i}.attn_v.weight"] for i in range(3)] == ["q5_k", "q5_k", "q4_k"]
    assert [m[f"blk.{i}.ffn_down.weight"] for i in range(2)] == ["q5_k", "q4_k"]  # i < 16/16
    assert m["blk.3.attn_output.weight"] == "q4_k" and m["blk.3.attn_q.weight"] == "q3_k"
    lg = mix_types("q3_k_l", t)
    assert lg["blk.9.attn_v.weight"] == lg["blk.9.ffn_down.weight"] == lg["blk.9.attn_output.weight"] == "q5_k"
    assert mix_types("q3_k_s", t)["blk.9.ffn_down.weight"] == "q3_k"
    q2_gqa1 = mix_types("q2_k", t, n_head=8, n_head_kv=8)
    q2_gqa4 = mix_types("q2_k", t, n_head=8, n_head_kv=2)
    assert q2_gqa1["blk.5.attn_v.weight"] == "q3_k" and q2_gqa4["blk.5.attn_v.weight"] == "q4_k"
    assert q2_gqa1["blk.5.ffn_down.weight"] == q2_gqa1["blk.5.attn_output.weight"] == "q3_k"
    assert q2_gqa1["blk.5.ffn_up.weight"] == "q2_k"
    x = mix_types("iq4_xs", t, n_head=8, n_head_kv=2)
    assert x["blk.0.attn_v.weight"] == x["blk.1.ffn_down.weight"] == "q5_k" and x["blk.2.ffn_down.weight"] == "iq4_xs"


def test_heads_and_fallbacks() -> None:
    """Head: Q6_K, Q8_0 in Q8_0 files or when rows are not whole blocks; rows of 320 fall back per type."""
    for mix in ("q4_0", "q4_1", "q5_0", "q5_1", "q6_k", "iq4_nl", "q5_k_s"):
        assert mix_types(mix, _llama(2))["output.weight"] == "q6_k"
    assert mix_types("q8_0", _llama(2))["output.weight"] == "q8_0"
    assert mix_types("q4_0", _llama(2, width=96))["output.weight"] == "q8_0"  # 96 % 32 == 0, Q6_K does not fit
    assert mix_types("q4_k_m", _llama(2, width=96))["output.weight"] == "q8_0"  # 96 % 256 != 0
    tied = mix_types("q5_k_m", _llama(2, tied=True))
    assert tied["token_embd.weight"] == "q6_k" and "output.weight" not in tied
    fb = {mix: mix_types(mix, _llama(8, ffn=320), n_layer=8)["blk.3.ffn_down.weight"] for mix in MIXES}
    assert fb["q2_k"] == fb["q3_k_s"] == "q4_0" and fb["q4_k_s"] == "q5_0" and fb["q5_k_s"] == "q5_1"
    assert fb["q6_k"] == "q8_0" and fb["iq4_xs"] == "iq4_nl" and fb["q4_0"] == "q4_0"
    odd = mix_types("q4_0", [("blk.0.ffn_down.weight", (8, 48))])
    assert odd["blk.0.ffn_down.weight"] == "f16"  # 48 values: no 32-value block fits


def test_gpt2_names() -> None:
    """attn_qkv counts as attn_v; position_embd and 1-D tensors stay; a tied table is the head."""
    t: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (1000, 256)), ("position_embd.weight", (1024, 256))]
    for i in range(8):
        t += [(f"blk.{i}.attn_qkv.weight", (768, 256)), (f"blk.{i}.attn_qkv.bias", (768,))]
        t += [(f"blk.{i}.ffn_down.weight", (256, 1024)), (f"blk.{i}.attn_output.weight", (256, 256))]
    got = mix_types("q4_k_m", t)
    assert got["position_embd.weight"] is None and got["blk.0.attn_qkv.bias"] is None
    assert got["token_embd.weight"] == "q6_k"
    assert [got[f"blk.{i}.attn_qkv.weight"] for i in range(8)] == [
        "q6_k" if use_more_bits(i, 8) else "q4_k" for i in range(8)
    ]


@settings(max_examples=60, deadline=None)
@given(
    mix=st.sampled_from(list(MIXES)),
    n_layer=st.integers(1, 40),
    width=st.sampled_from([64, 96, 256, 320, 512]),
    gqa=st.sampled_from([1, 2, 4, 8]),
)
def test_every_choice_fits_its_rows(mix: str, n_layer: int, width: int, gqa: int) -> None:
    """Whatever the shape, each chosen format holds the tensor's rows in whole blocks and is at least as wide as the base."""
    t = _llama(n_layer, width=width, ffn=width * 2)
    got = mix_types(mix, t, n_head=8, n_head_kv=8 // gqa)
    base_bits = get_format(mix_base(mix)).block_bytes / get_format(mix_base(mix)).block_values
    for name, shape in t:
        kind = got[name]
        if kind is None:
            assert len(shape) == 1
            continue
        fmt = get_format(kind)
        assert shape[-1] % fmt.block_values == 0
        if shape[-1] % 256 == 0 and shape[-1] % get_format(mix_base(mix)).block_values == 0:
            assert fmt.block_bytes / fmt.block_values >= base_bits


def test_refusals() -> None:
    with pytest.raises(DTypeError, match="unknown quantization mix or format 'q4_k_x'.*q4_k_m"):
        mix_types("q4_k_x", _llama(1))
    with pytest.raises(DTypeError, match="unknown quantization mix or format 'f32'"):
        mix_types("f32", _llama(1))
    with pytest.raises(DTypeError, match="unknown quantization mix"):
        mix_base("Q4_K_M")
    with pytest.raises(ShapeError, match="negative dimension"):
        mix_types("q4_0", [("blk.0.attn_q.weight", (-1, 32))])
    with pytest.raises(ShapeError, match="cannot place tensor 'ffn_down.weight'"):
        mix_types("q4_k_m", [("ffn_down.weight", (32, 256))], n_expert=8, n_layer=2)
    with pytest.raises(ShapeError, match="n_head >= 1"):
        mix_types("q4_0", _llama(1), n_head=0)


@pytest.mark.parametrize("fmt", ["q4_k", "q3_k", "q5_k", "bf16", "f16"])
def test_a_format_name_is_a_uniform_plan(fmt: str) -> None:
    """Formats that are no llama.cpp file type: every quantizable tensor in the format, no per-layer rules;
    the head in Q6_K (a block format) or in the format itself (a float one); rows no block fits fall back."""
    assert plan_base(fmt) == fmt
    tensors = _llama(16, width=256, ffn=320)
    plan = mix_types(fmt, tensors, n_head=8, n_head_kv=2)
    blocked = get_format(fmt).blocked
    fallback = {"q3_k": "q4_0", "q4_k": "q5_0", "q5_k": "q5_1"}.get(fmt, fmt)
    for name, shape in tensors:
        if len(shape) < 2:
            assert plan[name] is None, name
        elif name == "output.weight":
            assert plan[name] == ("q6_k" if blocked else fmt), name
        elif shape[-1] % 256 and blocked:  # ffn_down's rows of 320
            assert plan[name] == fallback, name
        else:
            assert plan[name] == fmt, name


# -- kael's own quantized export equals llama-quantize's file ----------------------------------------
@pytest.mark.parametrize("mix", ["q4_k_m", "q3_k_s", "q2_k", "q5_k_s", "q6_k", "iq4_xs", "q4_0"])
def test_save_gguf_with_a_mix_equals_llama_quantize(f32_model: tuple[Path, dict], mix: str) -> None:
    """``save_gguf(model, weights=mix)`` from the float checkpoint writes every tensor in the type and with
    the bytes ``llama-quantize F32.gguf OUT MIX`` writes (no importance matrix), and says the same file type."""
    from kael.models import from_pretrained, save_gguf
    from kael.tokenizer import load_tokenizer

    src, _ = f32_model
    tool = llama_cpp_tools.require_tool("llama-quantize")
    theirs, ours = src.with_name(f"lq-{mix}.gguf"), src.with_name(f"kael-{mix}.gguf")
    r = subprocess.run([tool, str(src), str(theirs), mix.upper(), "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    save_gguf(from_pretrained(src.parent), ours, load_tokenizer(src.parent), weights=mix)
    a, b = gguf.GGUFReader(str(theirs)), gguf.GGUFReader(str(ours))
    want = {t.name: t for t in a.tensors}  # llama-quantize writes them in its own order (the output head first)
    got = {t.name: t for t in b.tensors}
    assert {n: t.tensor_type.name for n, t in got.items()} == {n: t.tensor_type.name for n, t in want.items()}
    for name, t in want.items():
        np.testing.assert_array_equal(np.asarray(got[name].data), np.asarray(t.data), err_msg=name)
    ftype = "general.file_type"
    assert int(b.fields[ftype].parts[-1][0]) == int(a.fields[ftype].parts[-1][0])
    theirs.unlink()
    ours.unlink()


def test_export_gguf_cli_writes_a_mix(f32_model: tuple[Path, dict]) -> None:
    """``python -m kael export-gguf DIR OUT --weights q4_k_m``: the file kael loads back, tensor by tensor in
    the types the plan gives (the bytes are the test above's)."""
    import sys

    import kael
    from kael.models import from_pretrained, load_gguf

    src, cfg = f32_model
    out = src.with_name("cli-q4_k_m.gguf")
    r = subprocess.run(
        [sys.executable, "-m", "kael", "export-gguf", str(src.parent), str(out), "--weights", "q4_k_m"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    plan = mix_types(
        "q4_k_m",
        [(name, shape) for name, shape, _ in _tensors(src)],
        n_head=cfg["num_attention_heads"],
        n_head_kv=cfg["num_key_value_heads"],
        n_layer=cfg["num_hidden_layers"],
    )
    assert {name: kind for name, _, kind in _tensors(out)} == {n: plan[n] or "f32" for n in plan}
    model, _ = load_gguf(out)
    # a loaded file's scheme: the one most of its tensors have (q5_0 where no 256-value block fits the rows)
    assert model.weights_scheme == Counter(v for v in plan.values() if v is not None).most_common(1)[0][0]
    # from_pretrained(weights="q4_k_m") holds the same blocks, so computes the same logits
    direct = from_pretrained(src.parent, weights="q4_k_m")
    assert direct.weights_scheme == "q4_k_m"
    kinds = {name: m.scheme for name, m in direct.named_modules() if hasattr(m, "scheme")}
    assert set(kinds.values()) == {v for v in plan.values() if v is not None}
    ids = kael.tensor([[1, 5, 9, 200, 7, 3]])
    with kael.no_grad():
        np.testing.assert_allclose(model(ids).numpy(), direct(ids).numpy(), rtol=1e-5, atol=1e-5)
    out.unlink()
