"""GPT-2 (kael/models/): reference logits and greedy continuations of the tiny checkpoint made
with Hugging Face transformers, both key layouts, strict loading errors, export, the KV cache
(decode == recompute, batches of different lengths == each row alone), generate and sample_next.

Oracles: tests/data/tiny-gpt2 (transformers' logits and greedy tokens), NumPy, and PyTorch's
autograd (skipped when torch is absent).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import kael
import numpy as np
import pytest
from kael.models import GPT, GPTConfig, PagedKVCache, load_gpt2, sample_next, save_pretrained

DATA = Path(__file__).resolve().parent.parent / "data" / "tiny-gpt2"
REF = json.loads((DATA / "reference.json").read_text())
CASES = {c["name"]: c for c in REF["cases"]}
TOL = REF["tolerance_logits_max_abs"]


@pytest.fixture(scope="module")
def model() -> GPT:
    return GPT.from_pretrained(DATA)


@pytest.fixture(scope="module")
def ref_logits() -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in kael.load_safetensors(DATA / "reference.safetensors").items()}


def _logits(m: GPT, ids: list[list[int]], **kw: Any) -> np.ndarray:
    with kael.no_grad():
        return m(kael.tensor(ids), **kw).numpy().copy()


def _tiny(vocab: int = 97, ctx: int = 16, layers: int = 2, heads: int = 2, dim: int = 8, seed: int = 0) -> GPT:
    return GPT(vocab, ctx, layers, heads, dim, generator=kael.Generator().manual_seed(seed))


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


# -- strict loading ---------------------------------------------------------------------------


def _write_checkpoint(tmp: Path, tensors: dict[str, kael.Tensor], config: dict[str, Any] | None = None) -> Path:
    d = tmp / "ckpt"
    d.mkdir(exist_ok=True)
    kael.save_safetensors(tensors, d / "model.safetensors")
    cfg = config if config is not None else json.loads((DATA / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture
def hf_tensors() -> dict[str, kael.Tensor]:
    return dict(kael.load_safetensors(DATA / "model.safetensors"))


def test_missing_and_unexpected_keys_are_named(tmp_path: Path, hf_tensors: dict[str, kael.Tensor]) -> None:
    del hf_tensors["transformer.h.1.ln_2.bias"]
    hf_tensors["transformer.h.0.attn.extra"] = kael.zeros(3)
    d = _write_checkpoint(tmp_path, hf_tensors)
    with pytest.raises(kael.FormatError) as info:
        GPT.from_pretrained(d)
    msg = str(info.value)
    assert "missing" in msg and "'transformer.h.1.ln_2.bias'" in msg
    assert "unexpected" in msg and "'transformer.h.0.attn.extra'" in msg


def test_shape_mismatch_is_named(tmp_path: Path, hf_tensors: dict[str, kael.Tensor]) -> None:
    hf_tensors["transformer.h.0.mlp.c_fc.weight"] = kael.zeros(128, 32)  # transposed
    with pytest.raises(
        kael.FormatError,
        match=r"'transformer\.h\.0\.mlp\.c_fc\.weight' has shape \[128, 32\].*"
        r"\[32, 128\]",
    ):
        GPT.from_pretrained(_write_checkpoint(tmp_path, hf_tensors))


def test_tied_lm_head_is_ignored_only_when_equal(
    tmp_path: Path, hf_tensors: dict[str, kael.Tensor], model: GPT
) -> None:
    hf_tensors["lm_head.weight"] = hf_tensors["transformer.wte.weight"].clone()
    m = GPT.from_pretrained(_write_checkpoint(tmp_path, hf_tensors))
    ids = CASES["prompt0"]["ids"]
    np.testing.assert_array_equal(_logits(m, [ids]), _logits(model, [ids]))
    hf_tensors["lm_head.weight"] = hf_tensors["lm_head.weight"] * 2.0
    with pytest.raises(kael.FormatError, match="untied LM head"):
        GPT.from_pretrained(_write_checkpoint(tmp_path, hf_tensors))


def test_bare_layout_strictness(tmp_path: Path) -> None:
    bare = dict(kael.load_safetensors(DATA / "model-bare-layout.safetensors"))
    bare["h.5.attn.bias"] = kael.zeros(1)  # a mask buffer of any layer is ignored...
    del bare["ln_f.weight"]
    bare["h.0.attn.c_attn.bias_extra"] = kael.zeros(1)  # ...other strangers are not
    m = GPT(50257, 64, 2, 2, 32, init=False)
    kael.save_safetensors(bare, tmp_path / "bare.safetensors")
    with pytest.raises(kael.FormatError) as info:
        load_gpt2(m, tmp_path / "bare.safetensors")
    msg = str(info.value)
    assert "['ln_f.weight']" in msg and "['h.0.attn.c_attn.bias_extra']" in msg and "h.5.attn.bias" not in msg


def test_failed_load_leaves_parameters_unchanged(
    tmp_path: Path, hf_tensors: dict[str, kael.Tensor], model: GPT
) -> None:
    m = GPT.from_pretrained(DATA)
    del hf_tensors["transformer.wpe.weight"]
    kael.save_safetensors(hf_tensors, tmp_path / "partial.safetensors")
    with pytest.raises(kael.FormatError, match="transformer.wpe.weight"):
        load_gpt2(m, tmp_path / "partial.safetensors")
    np.testing.assert_array_equal(m.wte.weight.detach().numpy(), model.wte.weight.detach().numpy())


@pytest.mark.parametrize(
    "change, match",
    [
        ({"n_layer": None}, "missing key 'n_layer'"),
        ({"n_head": 3}, "not divisible"),
        ({"n_embd": 0}, "n_embd must be a positive integer"),
        ({"n_positions": True}, "n_positions must be a positive integer"),
        ({"activation_function": "relu"}, "activation_function 'relu'"),
        ({"model_type": "llama"}, "model_type"),
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ],
)
def test_bad_config_is_a_format_error(
    tmp_path: Path, hf_tensors: dict[str, kael.Tensor], change: dict[str, Any], match: str
) -> None:
    cfg = json.loads((DATA / "config.json").read_text())
    for k, v in change.items():
        if v is None:
            del cfg[k]
        else:
            cfg[k] = v
    with pytest.raises(kael.FormatError, match=match):
        GPT.from_pretrained(_write_checkpoint(tmp_path, hf_tensors, cfg))


def test_missing_files_are_format_errors(tmp_path: Path) -> None:
    with pytest.raises(kael.FormatError, match="not a directory"):
        GPT.from_pretrained(tmp_path / "nope")
    with pytest.raises(kael.FormatError, match="config.json"):
        GPT.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(kael.FormatError, match="JSON object"):
        GPT.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((DATA / "config.json").read_text())
    with pytest.raises(kael.FormatError, match="no such file"):
        GPT.from_pretrained(tmp_path)


# -- export -----------------------------------------------------------------------------------


def test_save_pretrained_round_trip(tmp_path: Path, model: GPT) -> None:
    save_pretrained(model, tmp_path / "out")
    tensors, meta = kael.io.load_safetensors_with_metadata(tmp_path / "out" / "model.safetensors")
    assert meta == {"format": "pt"}
    assert set(tensors) == {"transformer." + n for n, _ in model.named_parameters()}
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    sizes = (cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["n_positions"], cfg["vocab_size"])
    assert sizes == (2, 2, 32, 64, 50257)
    assert cfg["model_type"] == "gpt2" and cfg["activation_function"] == "gelu_new"
    again = GPT.from_pretrained(tmp_path / "out")
    ids = CASES["prompt2"]["ids"]
    np.testing.assert_array_equal(_logits(again, [ids]), _logits(model, [ids]))


def test_half_precision_checkpoint_is_cast_on_load(tmp_path: Path, hf_tensors: dict[str, kael.Tensor]) -> None:
    half = {k: v.to(dtype=kael.float16) for k, v in hf_tensors.items()}
    m = GPT.from_pretrained(_write_checkpoint(tmp_path, half))
    assert m.dtype is kael.float32
    got = m.h[1].mlp.c_fc.weight.detach().numpy()
    want = hf_tensors["transformer.h.1.mlp.c_fc.weight"].numpy().astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    wide = GPT.from_pretrained(_write_checkpoint(tmp_path, half), dtype=kael.float64)
    assert wide.dtype is kael.float64 and wide.generate([1, 2], 3) == m.generate([1, 2], 3)


def test_transformers_reads_the_export(tmp_path: Path, model: GPT, ref_logits: dict[str, np.ndarray]) -> None:
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    save_pretrained(model, tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    case = CASES["prompt1"]
    with torch.no_grad():
        got = hf(torch.tensor([case["ids"]])).logits[0].numpy()
    assert np.abs(got - ref_logits[case["logits_key"]]).max() < TOL


# -- the KV cache -------------------------------------------------------------------------------


def test_cache_decode_equals_full_recompute(model: GPT) -> None:
    ids = CASES["sliding_window"]["ids"][:40]
    full = _logits(model, [ids])[0]
    cache = model.new_cache()
    assert isinstance(cache, PagedKVCache) and cache.keys[0].shape == (1, 2, 64, 16)
    with kael.no_grad():
        parts = [model(kael.tensor([ids[:7]]), cache).numpy()[0]]  # prefill, then chunks and single tokens
        parts.append(model(kael.tensor([ids[7:10]]), cache).numpy()[0])
        for i in range(10, 40):
            parts.append(model(kael.tensor([[ids[i]]]), cache).numpy()[0])
    assert cache.lengths == [40]
    np.testing.assert_allclose(np.concatenate(parts), full, atol=2e-5, rtol=0)


def test_cache_reset_reuses_the_memory(model: GPT) -> None:
    cache = model.new_cache(batch=2, max_positions=8)
    ids = CASES["prompt1"]["ids"]
    with kael.no_grad():
        first = model(kael.tensor([ids, ids]), cache).numpy().copy()
        cache.reset(1)
        assert cache.lengths == [5, 0]
        cache.reset()
        again = model(kael.tensor([ids, ids]), cache).numpy()
    np.testing.assert_array_equal(first, again)
    assert "lengths=[5, 5]" in repr(cache)
    with pytest.raises(kael.ShapeError):
        cache.reset(2)
    with pytest.raises(kael.ShapeError, match="max_positions"):
        model.new_cache(max_positions=65)


def test_cache_holds_keys_in_place(model: GPT) -> None:
    cache = model.new_cache(max_positions=10)
    buffers = [b._storage for b in cache.data]
    with kael.no_grad():
        model(kael.tensor([[1, 2, 3]]), cache)
        model(kael.tensor([[4]]), cache)
    assert [b._storage for b in cache.data] == buffers
    k = cache.keys[1].numpy()
    assert np.abs(k[0, :, :4]).max() > 0 and np.abs(k[0, :, 4:]).max() == 0
    with kael.no_grad(), pytest.raises(kael.ShapeError, match="exceed"):
        model(kael.tensor([[1] * 7]), cache)


def test_batch_of_different_lengths_equals_each_row_alone(model: GPT) -> None:
    a = CASES["prompt2"]["ids"]  # 12 tokens
    b = CASES["prompt1"]["ids"]  # 5 tokens
    padded = [a, b + [0] * (len(a) - len(b))]
    cache = model.new_cache(batch=2)
    with kael.no_grad():
        first = model(kael.tensor(padded), cache, lengths=[len(a), len(b)]).numpy()
        last = model(kael.tensor(padded), lengths=[len(a), len(b)], last_only=True).numpy()
    assert cache.lengths == [12, 5]
    alone_a, alone_b = _logits(model, [a])[0], _logits(model, [b])[0]
    np.testing.assert_allclose(first[0], alone_a, atol=2e-5, rtol=0)
    np.testing.assert_allclose(first[1, :5], alone_b, atol=2e-5, rtol=0)
    np.testing.assert_allclose(last[:, 0], [alone_a[-1], alone_b[-1]], atol=2e-5, rtol=0)
    # decode both rows at their own positions (12 and 5), then 3 tokens each at once
    seq_a, seq_b = list(a), list(b)
    next_a, next_b = first[0, -1], first[1, len(b) - 1]
    with kael.no_grad():
        for _ in range(4):
            ta, tb = int(np.argmax(next_a)), int(np.argmax(next_b))
            seq_a.append(ta)
            seq_b.append(tb)
            step = model(kael.tensor([[ta], [tb]]), cache).numpy()
            np.testing.assert_allclose(step[0, 0], _logits(model, [seq_a])[0, -1], atol=2e-5, rtol=0)
            np.testing.assert_allclose(step[1, 0], _logits(model, [seq_b])[0, -1], atol=2e-5, rtol=0)
            next_a, next_b = step[0, 0], step[1, 0]
        more = model(kael.tensor([[5, 6, 7], [8, 9, 10]]), cache).numpy()
    assert cache.lengths == [19, 12]
    np.testing.assert_allclose(more[0], _logits(model, [seq_a + [5, 6, 7]])[0, -3:], atol=2e-5, rtol=0)
    np.testing.assert_allclose(more[1], _logits(model, [seq_b + [8, 9, 10]])[0, -3:], atol=2e-5, rtol=0)


@pytest.mark.parametrize("direct", [True, False])
def test_decode_step_equals_the_general_forward_pass(model: GPT, direct: bool) -> None:
    from kael.models import GenericStep, decode_step

    ids = CASES["sliding_window"]["ids"][:30]
    cache = model.new_cache(max_positions=30)
    with kael.no_grad():
        model(kael.tensor([ids[:10]]), cache)
        decoder = decode_step(model, cache, direct)
        assert isinstance(decoder, GenericStep) != direct
        steps = []
        for t in ids[10:]:
            steps.append(decoder([0], [t]).numpy()[0].copy())
            cache.lengths[0] += 1
    assert cache.lengths == [30]
    np.testing.assert_allclose(np.stack(steps), _logits(model, [ids])[0, 10:], atol=2e-5, rtol=0)
    with pytest.raises(kael.ShapeError, match="past the cache"):
        decoder([0], [1])


def test_generate_without_fused_kernels(model: GPT, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend without fused kernels: the general path with the frontend's decompositions."""
    from kael import _dispatch

    real = _dispatch.fused_kernel
    monkeypatch.setattr(
        _dispatch,
        "fused_kernel",
        lambda dev, op: None if op in ("linear", "layer_norm", "gelu", "attention", "embedding") else real(dev, op),
    )
    for name in ("prompt1", "sliding_window"):
        assert model.generate(CASES[name]["ids"], 20) == CASES[name]["greedy_20"]


def test_forward_input_errors(model: GPT) -> None:
    with pytest.raises(kael.DTypeError):
        model(kael.tensor([[1.0, 2.0]]))
    with pytest.raises(kael.ShapeError, match=r"\[batch, tokens\]"):
        model(kael.tensor([1, 2]))
    with pytest.raises(kael.ShapeError, match="context of 64"):
        model(kael.zeros(1, 65, dtype=kael.int64))
    with pytest.raises(kael.IndexError_):
        model(kael.tensor([[50257]]))
    with pytest.raises(kael.ShapeError, match="lengths"):
        model(kael.tensor([[1, 2]]), lengths=[3])
    with kael.no_grad(), pytest.raises(kael.ShapeError, match="2 rows"):
        model(kael.tensor([[1]]), model.new_cache(batch=2))


def test_cache_with_gradients_is_refused() -> None:
    m = _tiny()
    with pytest.raises(kael.AutogradError, match="no_grad"):
        m(kael.tensor([[1, 2]]), m.new_cache())


# -- generate and sample_next -----------------------------------------------------------------------


def test_on_token_controls_generation(model: GPT) -> None:
    ids, want = CASES["prompt0"]["ids"], CASES["prompt0"]["greedy_20"]
    seen: list[int] = []
    assert model.generate(ids, 20, on_token=lambda t: seen.append(t)) == want == seen  # None continues
    seen.clear()
    assert model.generate(ids, 20, on_token=lambda t: seen.append(t) or len(seen) < 3) == want[:3] == seen
    assert model.generate(ids, 20, on_token=lambda t: 0) == want[:1]
    assert model.generate(ids, 20, on_token=lambda t: "yes") == want

    def boom(t: int) -> bool:
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        model.generate(ids, 20, on_token=boom)


def test_generate_accepts_a_tensor_prompt_and_restores_the_mode() -> None:
    m = _tiny()
    assert m.training
    out = m.generate(kael.tensor([3, 1, 4]), 6)
    assert m.training and len(out) == 6 and all(0 <= t < 97 for t in out)
    assert out == m.generate([3, 1, 4], 6)
    assert m.generate([3], 0) == []


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"temperature": 0.0005}, kael.KaelError),
        ({"temperature": -1.0}, kael.KaelError),
        ({"temperature": math.nan}, kael.KaelError),
        ({"temperature": math.inf}, kael.KaelError),
        ({"top_k": -1}, kael.KaelError),
        ({"top_k": 1.5}, kael.KaelError),
        ({"generator": 42}, kael.DTypeError),
        ({"max_new_tokens": -1}, kael.KaelError),
    ],
)
def test_generate_argument_errors(kwargs: dict[str, Any], error: type[Exception]) -> None:
    m = _tiny()
    args = {"max_new_tokens": 3, **kwargs}
    with pytest.raises(error):
        m.generate([1, 2], **args)


def test_generate_prompt_errors() -> None:
    m = _tiny()
    with pytest.raises(kael.KaelError, match="empty"):
        m.generate([], 3)
    with pytest.raises(kael.ShapeError, match="out of range"):
        m.generate([1, 97], 3)
    with pytest.raises(kael.DTypeError):
        m.generate([1, "a"], 3)


def test_sampling_is_seeded_and_top_k_bounds_it() -> None:
    m = _tiny(seed=1)

    def run(**kw: Any) -> list[int]:
        return m.generate([5, 6], 12, generator=kael.Generator().manual_seed(7), **kw)

    assert run(temperature=1.0) == run(temperature=1.0)
    assert run(temperature=1.0, top_k=97) == run(temperature=1.0, top_k=0) == run(temperature=1.0, top_k=500)
    assert run(temperature=2.0, top_k=1) == m.generate([5, 6], 12)  # top-1 is greedy
    assert run(temperature=0.0) == m.generate([5, 6], 12)


def test_sample_next_greedy_and_ties() -> None:
    logits = kael.tensor([0.5, 2.0, -1.0, 2.0])
    assert sample_next(logits) == 1
    assert sample_next(kael.tensor([[0.0, 1.0], [3.0, -3.0]])) == [1, 0]
    with pytest.raises(kael.ShapeError):
        sample_next(kael.tensor([1, 2]))


def test_sample_next_follows_softmax_with_top_k() -> None:
    logits = np.array([1.0, 0.0, 2.0, -1.0, 0.5], np.float32)
    t = 0.7
    g = kael.Generator().manual_seed(123)
    n = 4000
    counts = np.bincount([sample_next(kael.tensor(logits), t, 0, g) for _ in range(n)], minlength=5)
    p = np.exp(logits / t) / np.exp(logits / t).sum()
    assert np.abs(counts / n - p).max() < 4 * np.sqrt(p.max() * (1 - p.max()) / n)
    top = np.bincount([sample_next(kael.tensor(logits), t, 2, g) for _ in range(n)], minlength=5)
    assert set(np.nonzero(top)[0]) == {0, 2}  # only the two largest
    q = p[[0, 2]] / p[[0, 2]].sum()
    assert abs(top[0] / n - q[0]) < 4 * np.sqrt(q[0] * q[1] / n)


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
