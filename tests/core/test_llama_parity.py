"""Llama-family models (kael/models/llama/) against transformers on random-weight checkpoints built
offline: float32 logits within 1e-4 on several prompts, 32-token greedy continuations with the KV
cache identical to transformers' generate(do_sample=False), on the reference and the C++ CPU
backend. Cases cover llama, qwen2 (q/k/v biases) and mistral; grouped-query attention with 1, 2
and all key/value heads; tied and untied heads; a head_dim other than hidden/heads; llama3,
linear, dynamic and yarn rope scaling; a bfloat16 checkpoint loaded as float32.

Oracle: transformers' LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM (PyTorch, CPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kael
import numpy as np
import pytest
from kael.models import LlamaForCausalLM
from llama_checkpoints import build

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama_gqa2": ("llama", {}),
    "llama_mqa_tied_head_dim_llama3": (
        "llama",
        {"num_key_value_heads": 1, "tie_word_embeddings": True, "head_dim": 24, "rope_parameters": LLAMA3},
    ),
    "llama_mha_bias_linear": (
        "llama",
        {
            "num_key_value_heads": 4,
            "attention_bias": True,
            "mlp_bias": True,
            "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        },
    ),
    "llama_dynamic": ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 500.0}}),
    "llama_yarn": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "rope_theta": 10000.0,
            }
        },
    ),
    "qwen2_tied": ("qwen2", {"tie_word_embeddings": True, "num_hidden_layers": 3}),
    "mistral_mqa": ("mistral", {"num_key_value_heads": 1, "rope_theta": 1e6}),
}
PROMPTS = [[1], [5, 17, 300, 2, 99, 64, 8], list(range(3, 60, 2))]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    out = {}
    for i, (name, (family, kw)) in enumerate(CASES.items()):
        d = tmp_path_factory.mktemp(name)
        out[name] = (d, build(d, family, seed=i, **kw))
    return out


def _hf_logits(hf: Any, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        out: np.ndarray = hf(torch.tensor([ids])).logits[0].numpy()
    return out


def _hf_greedy(hf: Any, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        # no end-of-sequence stop: all n tokens, whatever they are
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return [int(t) for t in out[0, len(ids) :]]


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(checkpoints: dict[str, tuple[Path, Any]], backend: str, case: str) -> None:
    d, hf = checkpoints[case]
    m = LlamaForCausalLM.from_pretrained(d)
    for ids in PROMPTS:
        with kael.no_grad():
            got = m(kael.tensor([ids])).numpy()[0]
        want = _hf_logits(hf, ids)
        assert got.shape == want.shape == (len(ids), 320)
        assert np.abs(got - want).max() < 1e-4, (case, len(ids))
    # a batch of right-padded rows of different lengths: each row's real positions as alone
    batch = [PROMPTS[1] + [0] * 3, PROMPTS[1][:4] + [0] * 6]
    with kael.no_grad():
        got = m(kael.tensor(batch), m.new_cache(2), lengths=[7, 4]).numpy()
    np.testing.assert_allclose(got[0, :7], _hf_logits(hf, PROMPTS[1]), atol=1e-4, rtol=0)
    np.testing.assert_allclose(got[1, :4], _hf_logits(hf, PROMPTS[1][:4]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_continuation_matches_transformers(
    checkpoints: dict[str, tuple[Path, Any]], backend: str, case: str
) -> None:
    d, hf = checkpoints[case]
    m = LlamaForCausalLM.from_pretrained(d)
    for ids in PROMPTS[:2]:
        want = _hf_greedy(hf, ids, 32)
        assert m.generate(ids, 32) == want, case
        # the cache: decoding after the prompt equals recomputing the whole sequence each step
        seq = ids + want
        with kael.no_grad():
            full = m(kael.tensor([seq])).numpy()[0]
        assert [int(t) for t in np.argmax(full[len(ids) - 1 : -1], axis=-1)] == want


def test_bfloat16_checkpoint_loads_as_float32(tmp_path: Path, backend: str) -> None:
    hf = build(tmp_path, "llama", save_dtype=torch.bfloat16, num_key_value_heads=1)
    m = LlamaForCausalLM.from_pretrained(tmp_path)
    assert m.dtype is kael.float32
    # the same bfloat16 values computed in float32 (loaded afresh: hf.float() would keep the rotary
    # frequencies that .to(bfloat16) rounded)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert ref.dtype == torch.float32 and hf.dtype == torch.bfloat16
    for name, t in ref.state_dict().items():
        np.testing.assert_array_equal(dict(m.named_parameters())[name].detach().numpy(), t.numpy())
    for ids in PROMPTS[:2]:
        with kael.no_grad():
            got = m(kael.tensor([ids])).numpy()[0]
        assert np.abs(got - _hf_logits(ref, ids)).max() < 1e-4
    assert m.generate(PROMPTS[1], 32) == _hf_greedy(ref, PROMPTS[1], 32)


def test_float64_model_matches_transformers_in_float64(checkpoints: dict[str, tuple[Path, Any]], backend: str) -> None:
    d, hf = checkpoints["llama_mqa_tied_head_dim_llama3"]
    m = LlamaForCausalLM.from_pretrained(d, dtype=kael.float64)
    h64 = hf.double()
    try:
        for ids in PROMPTS:
            with kael.no_grad():
                got = m(kael.tensor([ids])).numpy()[0]
            assert got.dtype == np.float64
            # transformers computes its rotary tables in float32 even for a float64 model
            assert np.abs(got - _hf_logits(h64, ids)).max() < 1e-5
    finally:
        hf.float()
