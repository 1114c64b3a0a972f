"""Quantized and half-precision weights in the model families (kael/models/_weights.py, the families'
models and steps): ``from_pretrained(weights=...)`` for GPT-2 and the Llama family, and their decode paths.
Oracles: transformers' float32 model run on the weights rounded the way the scheme rounds them (GGUF's own
``gguf.quants.quantize``/``dequantize`` for Q8_0/Q4_0, torch's bfloat16 cast, NumPy's float16 cast), the
model's own general forward pass and generic decode step, and each row decoded alone. Quantized checkpoints
are tested in test_quantized_checkpoints.py, the bundled models in test_quantized_bundled_models.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kael
import numpy as np
import pytest
from kael import _dispatch
from kael.models import BatchDecoder, GenericStep, decode_step
from kael.models._generate import _prefill
from kael.models._weights import QuantizedTable
from kael.models.gpt2 import GPT2DecodeStep
from kael.models.llama import LlamaDecodeStep
from kael.quant import QuantizedLinear
from quantized_models_common import FAMILIES, SCHEMES, VOCAB, build_checkpoints, from_pretrained
from quantized_models_common import logits_of as _logits
from quantized_models_common import random_ids as _ids

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """A small random checkpoint of each family: (directory, the transformers model)."""
    return build_checkpoints(tmp_path_factory)


def head_scheme(scheme: str) -> str:
    """The head's format: llama.cpp's Q6_K under a block format but q8_0, whose 256-value blocks do not fit
    these models' 64-wide rows, so Q8_0; a float format's own (NOTE [weights choice])."""
    return "q8_0" if scheme in ("q8_0", "q4_0") else scheme


def rounded(w: np.ndarray, scheme: str) -> np.ndarray:
    """w [N, K] float32 as the scheme stores it, back in float32 (the oracle of each format)."""
    if scheme in ("q8_0", "q4_0"):
        qtype = getattr(gguf.GGMLQuantizationType, scheme.upper())
        out: np.ndarray = gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).reshape(w.shape)
        return out.astype(np.float32)
    if scheme == "bf16":
        return torch.from_numpy(np.ascontiguousarray(w)).to(torch.bfloat16).float().numpy()
    return w.astype(np.float16).astype(np.float32)


def _hf_rounded(family: str, hf: Any, scheme: str) -> Any:
    """A float32 copy of the transformers model whose weights are rounded as ``weights=scheme`` rounds them
    (NOTE [weights choice]: projections and token table in the scheme, the head in head_scheme)."""
    import copy

    model = copy.deepcopy(hf)
    tied = family in ("gpt2", "llama-tied")
    with torch.no_grad():
        for name, p in model.named_parameters():
            w = p.detach().numpy()
            if p.ndim != 2 or name.endswith("wpe.weight"):
                continue
            if name.endswith(("wte.weight", "embed_tokens.weight")):
                p.copy_(torch.from_numpy(rounded(w, head_scheme(scheme) if tied else scheme)))
            elif name == "lm_head.weight":
                p.copy_(torch.from_numpy(rounded(w, head_scheme(scheme))))
            elif family == "gpt2":  # Conv1D [in, out]: blocks run along in
                p.copy_(torch.from_numpy(np.ascontiguousarray(rounded(np.ascontiguousarray(w.T), scheme).T)))
            else:
                p.copy_(torch.from_numpy(rounded(w, scheme)))
    return model


# -- the model in each format equals transformers on the rounded weights ------------------------
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.usefixtures("float_activations")  # transformers computes on float32 activations
def test_logits_equal_transformers_on_the_rounded_weights(
    checkpoints: dict[str, tuple[Path, Any]], family: str, scheme: str
) -> None:
    d, hf = checkpoints[family]
    model = from_pretrained(d, weights=scheme)
    assert model.weights_scheme == scheme and model.dtype is kael.float32
    ids = _ids(family, 24)
    want = _hf_rounded(family, hf, scheme)(torch.tensor([ids])).logits[0].detach().numpy()
    got = _logits(model, ids)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)
    # and the formats really changed the model: the float one differs from its rounded self
    if scheme in ("q8_0", "q4_0"):
        assert np.abs(_logits(from_pretrained(d), ids) - got).max() > 1e-4 * scale


@pytest.mark.parametrize("family", FAMILIES)
def test_what_is_quantized(checkpoints: dict[str, tuple[Path, Any]], family: str) -> None:
    """Projections and the token table in the scheme, the head (and a tied table) in head_scheme,
    norms, biases and GPT-2's position table float32 (NOTE [weights choice])."""
    d, _ = checkpoints[family]
    model = from_pretrained(d, weights="q4_0")
    schemes = {name: m.scheme for name, m in model.named_modules() if isinstance(m, (QuantizedLinear, QuantizedTable))}
    table = "wte" if family == "gpt2" else "model.embed_tokens"
    assert schemes.pop(table) == ("q4_0" if family in ("llama", "qwen2") else "q8_0")
    if family in ("llama", "qwen2"):
        assert schemes.pop("lm_head") == "q8_0"
    layers = 2
    per_layer = 4 if family == "gpt2" else 7
    assert len(schemes) == layers * per_layer and set(schemes.values()) == {"q4_0"}
    assert all(p.dtype is kael.float32 for p in model.parameters())
    names = {n for n, _ in model.named_parameters()}
    assert ("wpe.weight" in names) == (family == "gpt2")
    assert not any(n.endswith(("proj.weight", "c_attn.weight", "c_fc.weight")) for n in names)


def test_weights_argument_is_validated(checkpoints: dict[str, tuple[Path, Any]], tmp_path: Path) -> None:
    d, _ = checkpoints["llama"]
    with pytest.raises(kael.KaelError, match=r"weights must be None or one of .*'q4_0'.*got 'q7_0'"):
        from_pretrained(d, weights="q7_0")
    with pytest.raises(kael.DTypeError, match=r"weights='q8_0' computes in float32.*got kael.bfloat16"):
        from_pretrained(d, weights="q8_0", dtype=kael.bfloat16)
    assert from_pretrained(d, weights="f32").weights_scheme is None
    from_pretrained(d, weights="q8_0").save_pretrained(tmp_path / "q8")
    with pytest.raises(
        kael.KaelError, match=r"already holds q8_0 weights; weights='q4_0' would requantize them, a second rounding"
    ):
        from_pretrained(tmp_path / "q8", weights="q4_0")
    assert from_pretrained(tmp_path / "q8", weights="q8_0").weights_scheme == "q8_0"
    with pytest.raises(
        kael.KaelError, match=r"already holds q8_0 weights; weights='f32' would requantize them, a second rounding"
    ):
        from_pretrained(tmp_path / "q8", weights="f32")
    with pytest.raises(kael.DTypeError, match=r"weights='q8_0' computes in float32"):
        from_pretrained(tmp_path / "q8", dtype=kael.float16)


# -- decode paths ----------------------------------------------------------------------------------
def _step_type(family: str) -> type:
    return GPT2DecodeStep if family == "gpt2" else LlamaDecodeStep


@pytest.mark.usefixtures("float_activations")  # a float oracle (tests/conftest.py)
@pytest.mark.parametrize("scheme", ["q8_0", "q4_0", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_direct_step_equals_generic_step_and_forward(
    checkpoints: dict[str, tuple[Path, Any]], family: str, scheme: str, backend: str
) -> None:
    model = from_pretrained(checkpoints[family][0], weights=scheme)
    ids = _ids(family, 20, seed=1)
    full = _logits(model, ids)[8:]
    got = {}
    for direct in (None, False):
        cache = model.new_cache(max_positions=20)
        with kael.no_grad():
            model(kael.tensor([ids[:8]]), cache)
            step = decode_step(model, cache, direct)
            if direct is False or _dispatch.fused_kernel("cpu", "quantized_linear") is None:
                assert isinstance(step, GenericStep)  # a backend without quantized_linear: the generic step
            else:
                assert isinstance(step, _step_type(family))
            rows = []
            for t in ids[8:]:
                rows.append(step([0], [t]).numpy()[0].copy())
                cache.lengths[0] += 1
        got[direct] = np.stack(rows)
    np.testing.assert_allclose(got[None], got[False], rtol=0, atol=2e-5)
    np.testing.assert_allclose(got[None], full, rtol=0, atol=2e-5)
    assert (got[None].argmax(-1) == got[False].argmax(-1)).all()


@pytest.mark.parametrize("scheme", ["q8_0", "q4_0"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_default_paths_for_decode_and_prompts(
    checkpoints: dict[str, tuple[Path, Any]], family: str, scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C++ backend's default (KAEL_QUANT_ACTIVATIONS unset, NOTE [integer quantized linear]): each decode
    step's logits are ``q8``'s (activations rounded as llama.cpp does) after the same prompt; a 24-token
    prompt's are the integer GEMM's where the table has it (AVX-512 VNNI: NOTE [integer GEMM]), within
    the activation rounding of the float32-activation path's, else that path's bits."""
    kbc = pytest.importorskip("kael_backend_cpu")
    c = kbc._native.C
    if c.isa() in ("baseline", "base"):
        pytest.skip("the baseline table's default is the float path")
    gemm = c.isa() == "avx512" and c.isa_info()["features"]["avx512_vnni"]
    kael.backends.use("cpu", "cpu")
    try:
        model = from_pretrained(checkpoints[family][0], weights=scheme)
        ids = _ids(family, 28, seed=3)

        def mode(name: str | None) -> None:
            if name is None:
                monkeypatch.delenv("KAEL_QUANT_ACTIVATIONS", raising=False)
            else:
                monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", name)

        def run(prefill: str | None, steps: str | None) -> tuple[np.ndarray, np.ndarray]:
            cache = model.new_cache(max_positions=28)
            with kael.no_grad():
                mode(prefill)
                prompt = model(kael.tensor([ids[:24]]), cache).numpy()[0].copy()
                mode(steps)
                step = decode_step(model, cache)
                rows = []
                for t in ids[24:]:
                    rows.append(step([0], [t]).numpy()[0].copy())
                    cache.lengths[0] += 1
            return prompt, np.stack(rows)

        default, f32, q8 = run(None, None), run("f32", "f32"), run(None, "q8")
    finally:
        kael.backends.use("cpu", None)
    np.testing.assert_array_equal(default[1], q8[1])
    prompt_span = float(np.ptp(f32[0]))
    if gemm:
        # (the rounding compounds over the layers of these tiny random models: up to 3.5% seen)
        assert 0 < float(np.abs(default[0] - f32[0]).max()) <= 0.05 * prompt_span
    else:
        np.testing.assert_array_equal(default[0], f32[0])
    span = float(np.ptp(f32[1]))
    assert 0 < float(np.abs(default[1] - f32[1]).max()) <= 0.05 * span


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_is_identical_direct_and_generic(
    checkpoints: dict[str, tuple[Path, Any]], family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kael.backends.use("cpu", "reference")  # has quantized_linear: generate runs the direct step
    try:
        model = from_pretrained(checkpoints[family][0], weights="q4_0")
        assert isinstance(decode_step(model, model.new_cache(1, 8)), _step_type(family))
        prompt = _ids(family, 6, seed=2)
        want = model.generate(prompt, 16)
        real = _dispatch.fused_kernel
        monkeypatch.setattr(
            _dispatch, "fused_kernel", lambda dev, op: None if op == "quantized_linear" else real(dev, op)
        )
        assert model.decode_step(model.new_cache(1, 8)) is None
        assert model.generate(prompt, 16) == want
    finally:
        kael.backends.use("cpu", None)


@pytest.mark.parametrize("scheme", ["q8_0", "q4_0", "f16"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_batched_rows_equal_each_alone_bit_for_bit(
    checkpoints: dict[str, tuple[Path, Any]], family: str, scheme: str, backend: str
) -> None:
    model = from_pretrained(checkpoints[family][0], weights=scheme)
    v = VOCAB[family]
    prompts = [[1, 2, 3], [5] * 9, [7, 8], [9, 4] * 6, [11]]
    steps = {0: 8, 1: 3, 2: 8, 3: 5, 4: 6}
    fed = {i: [(i * 7 + k) % v for k in range(steps[i])] for i in steps}
    joins, rows = {0: 0, 1: 0, 2: 3, 3: 4, 4: 4}, {0: 4, 1: 0, 2: 2, 3: 1, 4: 3}
    engine = BatchDecoder(model, rows=5)
    got: dict[int, list[np.ndarray]] = {i: [] for i in steps}
    done = dict.fromkeys(steps, 0)
    for step in range(14):
        for i in steps:
            if joins[i] == step:
                got[i].append(engine.prefill(rows[i], prompts[i]).numpy().copy())
        live = [i for i in steps if joins[i] <= step and done[i] < steps[i]]
        for i in steps:
            if joins[i] <= step and done[i] == steps[i] and engine.length(rows[i]):
                engine.release(rows[i])
        if live:
            logits = engine.decode([rows[i] for i in live], [fed[i][done[i]] for i in live]).numpy()
            for j, i in enumerate(live):
                got[i].append(logits[j].copy())
                done[i] += 1
    for i in steps:
        cache = model.new_cache(1, len(prompts[i]) + steps[i] + 1)
        with kael.no_grad():
            want = [_prefill(model, prompts[i], cache).numpy().copy()]
            decoder = decode_step(model, cache)
            for t in fed[i]:
                want.append(decoder([0], [t]).numpy()[0].copy())
                cache.lengths[0] += 1
        assert len(got[i]) == len(want) == steps[i] + 1
        for a, b in zip(got[i], want):
            np.testing.assert_array_equal(a.reshape(-1), b.reshape(-1))


def test_fused_qkv_and_gate_up_are_rebuilt_over_the_quantized_weights(checkpoints: dict[str, tuple[Path, Any]]) -> None:
    """on_quantized: q/k/v (and gate/up) QuantizedLinear weights and biases become row blocks of one
    buffer each, and the direct step runs one quantized product over each (its logits are checked
    against the generic step and the forward pass above)."""
    model = from_pretrained(checkpoints["qwen2"][0], weights="q8_0")
    a, m = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert a.q_proj.weight._storage is a.k_proj.weight._storage is a.v_proj.weight._storage
    assert a.q_proj.bias._storage is a.v_proj.bias._storage
    assert m.gate_proj.weight._storage is m.up_proj.weight._storage
    assert a.k_proj.weight.shape == (32, 64 // 32 * 34) and a.k_proj.weight.is_contiguous()
    kael.backends.use("cpu", "reference")
    try:
        step = decode_step(model, model.new_cache(1, 8))
        assert isinstance(step, LlamaDecodeStep)
        assert all(lay.qkv is not None and lay.qkv.scheme == "q8_0" for lay in step.layers)
        assert all(lay.gate_up is not None and lay.gate_up.scheme == "q8_0" for lay in step.layers)
    finally:
        kael.backends.use("cpu", None)
