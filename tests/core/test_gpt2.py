"""GPT-2 (kael/models/): the model against reference logits and greedy continuations.

The tiny checkpoint's logits and greedy continuations made with Hugging Face transformers
(including a prompt that slides past the context), the bare key layout loading the same
weights, parameter names and shapes, GPT-2 small's size and initialisation, mmap loading, and
the gradients of a small model against GPT-2 written directly in PyTorch (skipped when torch is
absent). Oracles: tests/data/tiny-gpt2 (transformers' logits and greedy tokens), NumPy and
PyTorch's autograd. Loading errors and export are in test_gpt2_checkpoints.py, the KV cache in
test_gpt2_kv_cache.py, generate and sample_next in test_gpt2_generate.py.
"""

from __future__ import annotations

import math
import re
from typing import Any

import kael
import numpy as np
import pytest
from gpt2_reference import CASES, DATA, REF, TOL
from gpt2_reference import logits_of as _logits
from gpt2_reference import tiny_gpt as _tiny
from kael.models import GPT, GPTConfig, load_gpt2

# -- the reference checkpoint ----------------------------------------------------------------


@pytest.mark.parametrize("name", [c["name"] for c in REF["cases"] if "logits_key" in c])
def test_logits_match_reference(model: GPT, ref_logits: dict[str, np.ndarray], name: str) -> None:
    case = CASES[name]
    got = _logits(model, [case["ids"]])[0]
    want = ref_logits[case["logits_key"]]
    assert got.shape == want.shape == (len(case["ids"]), 50257)
    assert np.abs(got - want).max() < TOL
    assert list(np.argsort(-got[-1], kind="stable")[:5]) == case["top5_last"]


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_continuation_matches_reference(model: GPT, name: str) -> None:
    case = CASES[name]
    assert model.generate(case["ids"], 20) == case["greedy_20"]


def test_sliding_window_runs_past_the_context(model: GPT) -> None:
    case = CASES["sliding_window"]
    assert len(case["ids"]) + 20 > model.max_positions
    # the same tokens, one model call per step on the last 64 tokens, no cache: an independent loop
    seq = list(case["ids"])
    for _ in range(20):
        window = seq[-model.max_positions :]
        seq.append(int(np.argmax(_logits(model, [window])[0, -1])))
    assert seq[len(case["ids"]) :] == case["greedy_20"]
    # a prompt longer than the context is windowed from the start
    long_prompt = seq[:70]
    assert model.generate(long_prompt, 5) == model.generate(long_prompt[-64:], 1) + model.generate(
        long_prompt[-63:] + model.generate(long_prompt[-64:], 1), 4
    )


def test_bare_layout_loads_the_same_weights(model: GPT) -> None:
    bare = GPT.from_config(model.config, init=False)
    load_gpt2(bare, DATA / "model-bare-layout.safetensors")
    for (name, p), (name2, q) in zip(model.named_parameters(), bare.named_parameters()):
        assert name == name2
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
    case = CASES["prompt1"]
    np.testing.assert_array_equal(_logits(bare, [case["ids"]]), _logits(model, [case["ids"]]))


def test_parameter_names_are_the_checkpoint_keys(model: GPT) -> None:
    bare_keys = set(kael.load_safetensors(DATA / "model-bare-layout.safetensors"))
    names = {n for n, _ in model.named_parameters()}
    assert names == {k for k in bare_keys if not re.fullmatch(r"h\.\d+\.attn\.(bias|masked_bias)", k)}
    assert set(model.state_dict()) == names
    p = dict(model.named_parameters())
    assert p["h.0.attn.c_attn.weight"].shape == (32, 96)  # [in, out], like Hugging Face's Conv1D
    assert p["h.1.mlp.c_proj.weight"].shape == (128, 32)
    assert "lm_head.weight" not in names  # tied to wte


def test_gpt2_small_shapes_without_initialising() -> None:
    m = GPT(init=False)
    assert m.config == GPTConfig() and (m.vocab_size, m.max_positions) == (50257, 1024)
    assert sum(p.numel() for p in m.parameters()) == 124_439_808  # GPT-2 small


def test_gpt2_initialisation() -> None:
    m = GPT(1000, 64, 2, 2, 64, generator=kael.Generator().manual_seed(0))
    p = {n: t.detach().numpy() for n, t in m.named_parameters()}
    assert abs(p["wte.weight"].std() - 0.02) < 0.001 and abs(p["wte.weight"].mean()) < 0.001
    assert abs(p["h.1.attn.c_attn.weight"].std() - 0.02) < 0.001
    assert abs(p["h.0.mlp.c_proj.weight"].std() - 0.02 / math.sqrt(4)) < 0.001  # residual projections scaled
    assert (p["h.0.ln_2.weight"] == 1).all() and (p["ln_f.bias"] == 0).all() and (p["h.1.mlp.c_fc.bias"] == 0).all()
    same = GPT(1000, 64, 2, 2, 64, generator=kael.Generator().manual_seed(0))
    np.testing.assert_array_equal(same.wpe.weight.detach().numpy(), p["wpe.weight"])


def test_mmap_load_equals_copy_load(model: GPT) -> None:
    mapped = GPT.from_pretrained(DATA, mmap=True)
    for (name, a), (_, b) in zip(mapped.named_parameters(), model.named_parameters()):
        assert a.shape == b.shape and np.array_equal(a.detach().numpy(), b.detach().numpy()), name
    # the two loads keep the Conv1D weights in different memory orders (NOTE [conv1d
    # layout]), so the products round differently: equal up to float32 rounding
    case = CASES["prompt2"]
    np.testing.assert_allclose(_logits(mapped, [case["ids"]]), _logits(model, [case["ids"]]), rtol=1e-5, atol=1e-5)
    assert not mapped.training


def test_copy_load_stores_conv1d_weights_out_major(model: GPT) -> None:
    mapped = GPT.from_pretrained(DATA, mmap=True)
    for name, p in model.named_parameters():
        if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            assert p._strides == (1, p.shape[0]), name  # [in, out] viewing [out, in] memory
    for name, p in mapped.named_parameters():
        if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            assert p._strides == (p.shape[1], 1), name  # the file's own order


# -- training: gradients against PyTorch ------------------------------------------------------------


def _torch_gpt_loss(torch: Any, w: dict[str, Any], ids: Any, cfg: GPTConfig) -> Any:
    """GPT-2 written directly in PyTorch (the oracle): mean next-token cross entropy."""
    F = torch.nn.functional
    b, t = ids.shape
    c, h = cfg.dimension, cfg.heads
    x = w["wte.weight"][ids] + w["wpe.weight"][:t]
    for i in range(cfg.layers):
        p = f"h.{i}."
        a = F.layer_norm(x, (c,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], cfg.layer_norm_epsilon)
        q, k, v = (a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]).split(c, dim=2)
        q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        a = F.layer_norm(x, (c,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], cfg.layer_norm_epsilon)
        a = F.gelu(a @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + a @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (c,), w["ln_f.weight"], w["ln_f.bias"], cfg.layer_norm_epsilon)
    logits = x @ w["wte.weight"].T
    return F.cross_entropy(logits[:, :-1].reshape(-1, cfg.vocab_size), ids[:, 1:].reshape(-1))


def test_gradients_match_pytorch() -> None:
    torch = pytest.importorskip("torch")
    m = _tiny(vocab=31, ctx=12, layers=2, heads=2, dim=8, seed=3)
    ids = np.random.default_rng(0).integers(0, 31, size=(2, 9))
    logits = m(kael.tensor(ids))
    loss = kael.cross_entropy(logits[:, :-1].reshape(-1, 31), kael.tensor(ids[:, 1:].reshape(-1)))
    loss.backward()
    w = {n: torch.tensor(p.detach().numpy().astype(np.float64), requires_grad=True) for n, p in m.named_parameters()}
    want = _torch_gpt_loss(torch, w, torch.tensor(ids), m.config)
    want.backward()
    assert abs(loss.item() - want.item()) < 1e-5
    for n, p in m.named_parameters():
        assert p.grad is not None, n
        np.testing.assert_allclose(p.grad.numpy(), w[n].grad.numpy(), atol=2e-5, rtol=1e-3, err_msg=n)
