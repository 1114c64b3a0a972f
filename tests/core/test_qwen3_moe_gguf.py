"""Qwen3-MoE GGUF files (kael/models/_gguf_qwen3moe.py, architecture ``qwen3moe``): llama.cpp's converter output
of a random transformers Qwen3-MoE checkpoint (``convert_hf_to_gguf.py --outtype f32``, found through
tests/llama_cpp_tools.py; skipped without it), its experts stacked into ``ffn_{gate,up,down}_exps`` [E, ...]
tensors, loads as a ``Qwen3MoeForCausalLM`` with the checkpoint's tokenizer and transformers' logits;
``llama-quantize``'s Q8_0 of that file (Q8_0 expert stacks) loads with its bytes and the logits kael's own Q8_0
gives; llama.cpp (the ``llama_cpp`` package) runs the converter's file with kael's logits.

Oracles: transformers' Qwen3MoeForCausalLM on the checkpoint, kael's ``from_pretrained`` of the checkpoint (F32
and ``weights="q8_0"``: the same GGML Q8_0 bytes as llama-quantize writes), and llama.cpp.
"""

from __future__ import annotations

import subprocess
from typing import Any

import family_gguf as fg
import kael
import llama_cpp_tools
import numpy as np
import pytest
from family_parity import hf_greedy
from gguf_models_common import TEXT, logits_of, rewrite
from kael.models import from_pretrained, load_gguf
from kael.models.qwen3_moe import Qwen3MoeForCausalLM
from qwen3_moe_checkpoints import build

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

# llama.cpp's qwen3moe has no dense layers and always renormalises the routing weights (norm_topk_prob true):
# every layer sparse here, renormalised
SHAPES: dict[str, dict[str, Any]] = {
    "untied-gqa": {"tie_word_embeddings": False, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True},
    "tied-mqa": {"tie_word_embeddings": True, "num_key_value_heads": 1, "num_experts": 4, "num_experts_per_tok": 2,
                 "norm_topk_prob": True},
}  # fmt: skip
# Q8_0 against transformers' float32 logits, relative to the largest |logit|: every projection, the experts
# and the token table rounded to 8 bits per block of 32, and a token whose top-k experts change with the
# rounding takes another expert's output (routing is discrete). Measured on these shapes: 0.1 to 0.25 of the
# largest logit, top-1 agreement 0.85 and up; the bounds leave margin. The exact check is against kael's own
# Q8_0 of the checkpoint (the same bytes).
Q8_0_TOLERANCE = (0.4, 0.75)

checkpoint = fg.checkpoint_fixture("qwen3_moe", SHAPES, build)


def _converted_file(f: Any, hf: Any) -> None:
    c = hf.config
    assert f.metadata["qwen3moe.expert_count"] == c.num_experts
    assert f.metadata["qwen3moe.expert_used_count"] == c.num_experts_per_tok
    assert f.tensors["blk.1.ffn_gate_exps.weight"].shape == (c.num_experts, c.moe_intermediate_size, c.hidden_size)
    assert f.tensors["blk.0.ffn_down_exps.weight"].shape == (c.num_experts, c.hidden_size, c.moe_intermediate_size)
    assert f.tensors["blk.0.ffn_gate_inp.weight"].shape == (c.num_experts, c.hidden_size)


def _converted_model(model: Any, hf: Any) -> None:
    c = model.config
    assert (c.num_experts, c.num_experts_per_tok, c.norm_topk_prob) == (
        hf.config.num_experts,
        hf.config.num_experts_per_tok,
        True,
    )
    with kael.no_grad():  # a copy-mode load stacks the experts as from_pretrained does
        assert all(layer.mlp._stacked() is not None for layer in model.model.layers)


def test_converter_f32_file_matches_transformers(checkpoint: fg.Checkpoint) -> None:
    """As fg.check_converter_f32, at 2e-4 against transformers' float32 logits of the 65-token text: on the
    tied-mqa shape those are 1.1e-4 from transformers' own float64 forward (eager experts), kael's 4.4e-5."""
    d, hf = checkpoint
    path = fg.convert(d, d / "converted-f32.gguf")
    with kael.io.read_gguf(path) as f:
        assert f.metadata["general.architecture"] == "qwen3moe"
        _converted_file(f, hf)
        assert ("output.weight" in f.tensors) != hf.config.tie_word_embeddings
    model, tok = load_gguf(path)
    assert isinstance(model, Qwen3MoeForCausalLM) and model.weights_scheme is None
    _converted_model(model, hf)
    ids = fg.text_ids(d)
    assert tok.encode(TEXT * 2) == ids
    got = logits_of(model, ids)
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)
    np.testing.assert_allclose(got, logits_of(from_pretrained(d), ids), atol=1e-5, rtol=0)
    assert model.generate(ids[:12], 16) == hf_greedy(hf, ids[:12], 16)


def test_llama_quantize_q8_0_file(checkpoint: fg.Checkpoint) -> None:
    """Q8_0 expert stacks load as one QuantizedLinear per expert (the router stays float)."""
    fg.check_llama_quantize_q8_0(checkpoint, Qwen3MoeForCausalLM, Q8_0_TOLERANCE, relative=True)
    model, _ = load_gguf(checkpoint[0] / "q8_0.gguf")
    block = model.model.layers[0].mlp
    assert all(e.down_proj.scheme == "q8_0" for e in block.experts) and block.gate.weight.dtype is kael.float32


def test_llama_cpp_runs_the_converted_file_with_kaels_logits(checkpoint: fg.Checkpoint) -> None:
    llama_cpp = pytest.importorskip("llama_cpp", reason=llama_cpp_tools.SKIP_REASON + ": no llama_cpp package")
    d, _ = checkpoint
    path = fg.convert(d, d / "converted-f32.gguf")
    ids = fg.text_ids(d)
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=128, verbose=False, type_k=0, type_v=0)
    assert llm.tokenize((TEXT * 2).encode(), add_bos=True, special=True) == ids
    llm.eval(ids)
    theirs = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
    ours = logits_of(load_gguf(path)[0], ids)
    assert float(np.abs(theirs - ours).max()) < 1e-3
    assert (theirs.argmax(-1) == ours.argmax(-1)).all()


@pytest.mark.parametrize(
    ("meta", "match"),
    [
        ({"qwen3moe.expert_used_count": None}, "missing metadata key 'qwen3moe.expert_used_count'"),
        ({"qwen3moe.expert_used_count": 99}, "expert_used_count' 99 is more than expert_count"),
        ({"qwen3moe.expert_weights_norm": 1}, "expert_weights_norm"),
    ],
)
def test_bad_expert_metadata_is_refused(checkpoint: fg.Checkpoint, tmp_path: Any, meta: Any, match: str) -> None:
    d, _ = checkpoint
    src = fg.convert(d, d / "converted-f32.gguf")
    with pytest.raises(kael.FormatError, match=match):
        load_gguf(rewrite(src, tmp_path / "bad.gguf", meta=meta))


def test_expert_weights_norm_false_is_read(checkpoint: fg.Checkpoint, tmp_path: Any) -> None:
    d, _ = checkpoint
    src = fg.convert(d, d / "converted-f32.gguf")
    model, _ = load_gguf(rewrite(src, tmp_path / "plain.gguf", meta={"qwen3moe.expert_weights_norm": False}))
    assert model.config.norm_topk_prob is False


@pytest.mark.parametrize("name", ["converted-f32.gguf", "q8_0.gguf"])
def test_mapped_loads_give_the_copied_logits(checkpoint: fg.Checkpoint, name: str) -> None:
    """mmap=True (the F32 stacks copied into expert views, the Q8_0 experts over the file's mapping): the same
    logits as a copy-mode load (which stacks the float experts): ``expert_linear`` over the stacks gives each
    hit expert's own ``linear``'s bits."""
    d, _ = checkpoint
    fg.convert(d, d / "converted-f32.gguf")
    path = d / name
    if not path.exists():  # llama-quantize's Q8_0 of the converter's file, as test_llama_quantize_q8_0_file writes it
        tool = llama_cpp_tools.require_tool("llama-quantize")
        done = subprocess.run(
            [tool, str(d / "converted-f32.gguf"), str(path), "Q8_0"], capture_output=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
    ids = fg.text_ids(d)
    np.testing.assert_array_equal(logits_of(load_gguf(path, mmap=True)[0], ids), logits_of(load_gguf(path)[0], ids))


def test_llama_cpp_agrees_on_the_q8_0_file(checkpoint: fg.Checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    fg.check_llama_cpp_agrees_on_q8_0(checkpoint, monkeypatch)
