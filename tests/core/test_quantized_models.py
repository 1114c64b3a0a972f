"""Quantized and half-precision weights in the model families (kael/models/_weights.py, the families'
models, steps and checkpoints): ``from_pretrained(weights=...)`` for GPT-2 and the Llama family.

Oracles: transformers' float32 model run on the weights rounded the way the scheme rounds them
(GGUF's own ``gguf.quants.quantize``/``dequantize`` for Q8_0/Q4_0, torch's bfloat16 cast, NumPy's
float16 cast), the model's own general forward pass and generic decode step, each row decoded
alone, a saved checkpoint's bytes, and the bundled models' held-out loss as their READMEs
measured it (the same held-out text, batches and seed as examples/train_gpt.py and
examples/train_llama.py).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import kael
import numpy as np
import pytest
from kael import _dispatch
from kael._tensor import numpy_bits
from kael.io import load_safetensors_with_metadata, save_safetensors
from kael.models import BatchDecoder, GenericStep, decode_step
from kael.models import from_pretrained as _from_pretrained
from kael.models._generate import _prefill
from kael.models._weights import QUANTIZATION_KEY, WEIGHTS_KEY, QuantizedTable
from kael.models.gpt2 import GPT2DecodeStep
from kael.models.llama import LlamaDecodeStep
from kael.quant import QuantizedLinear
from llama_checkpoints import build

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
SCHEMES = ("q8_0", "q4_0", "bf16", "f16")
FAMILIES = ("gpt2", "llama", "llama-tied", "qwen2")
VOCAB = {"gpt2": 96, "llama": 320, "llama-tied": 320, "qwen2": 320}


@pytest.fixture(params=["reference", "cpu"])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    kael.backends.use("cpu", request.param)
    try:
        yield request.param
    finally:
        kael.backends.use("cpu", None)


def from_pretrained(*args: Any, **kwargs: Any) -> Any:
    """kael.models.from_pretrained, typed loosely (the tests use GPT's and Llama's own attributes)."""
    return _from_pretrained(*args, **kwargs)


def _build_gpt2(directory: Path) -> Any:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=96, n_positions=64, n_embd=64, n_layer=2, n_head=2, initializer_range=0.2)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(directory)
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """A small random checkpoint of each family: (directory, the transformers model)."""
    out = {}
    for family in FAMILIES:
        d = tmp_path_factory.mktemp(family)
        if family == "gpt2":
            hf = _build_gpt2(d)
        elif family == "llama-tied":
            hf = build(d, "llama", seed=5, tie_word_embeddings=True)
        else:
            hf = build(d, family, seed=3)
        out[family] = (d, hf)
    return out


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


def _logits(model: Any, ids: list[int]) -> np.ndarray:
    with kael.no_grad():
        out: np.ndarray = model(kael.tensor([ids])).numpy()[0].copy()
    return out


def _ids(family: str, n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB[family], size=n)]


# -- the model in each format equals transformers on the rounded weights ------------------------
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("family", FAMILIES)
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


# -- quantized checkpoints ----------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("family", ["gpt2", "llama", "llama-tied"])
def test_save_load_round_trip_is_bit_exact(
    checkpoints: dict[str, tuple[Path, Any]], family: str, scheme: str, tmp_path: Path
) -> None:
    model = from_pretrained(checkpoints[family][0], weights=scheme)
    model.save_pretrained(tmp_path)
    _, meta = load_safetensors_with_metadata(tmp_path / "model.safetensors")
    assert meta is not None and meta[WEIGHTS_KEY] == scheme
    spec = json.loads(meta[QUANTIZATION_KEY])
    assert spec["version"] == 1
    prefix = "transformer." if family == "gpt2" else ""
    want = {
        prefix + name + ".weight": {
            "scheme": mod.scheme,
            "shape": [mod.num_embeddings, mod.dim]
            if isinstance(mod, QuantizedTable)
            else [mod.out_features, mod.in_features],
        }
        for name, mod in model.named_modules()
        if isinstance(mod, (QuantizedLinear, QuantizedTable))
    }
    assert spec["tensors"] == want
    ids = _ids(family, 12)
    for mmap in (False, True):
        again = from_pretrained(tmp_path, mmap=mmap)
        assert again.weights_scheme == scheme
        a, b = model.state_dict(), again.state_dict()
        assert list(a) == list(b)
        for key in a:
            assert a[key].dtype is b[key].dtype
            np.testing.assert_array_equal(numpy_bits(a[key]), numpy_bits(b[key]))
        np.testing.assert_array_equal(_logits(again, ids), _logits(model, ids))


def test_a_sharded_quantized_checkpoint_loads(checkpoints: dict[str, tuple[Path, Any]], tmp_path: Path) -> None:
    """Each shard carries the metadata (save_checkpoint_tensors writes it to every one)."""
    import shutil

    from kael.io import save_checkpoint_tensors
    from kael.models._weights import quantization_metadata

    d, _ = checkpoints["llama"]
    model = from_pretrained(d, weights="q4_0")
    meta = {"format": "pt", **quantization_metadata(model, lambda name: f"{name}.weight")}
    files = save_checkpoint_tensors(tmp_path, model.state_dict(), max_shard_size="20KB", metadata=meta)
    assert len(files) > 3 and "model.safetensors.index.json" in files
    shutil.copy(d / "config.json", tmp_path / "config.json")
    again = from_pretrained(tmp_path)
    assert again.weights_scheme == "q4_0"
    ids = _ids("llama", 10)
    np.testing.assert_array_equal(_logits(again, ids), _logits(model, ids))


def _rewrite(
    path: Path, *, meta: dict[str, str] | None = None, drop: str | None = None, replace: dict[str, Any] | None = None
) -> None:
    """Rewrite a safetensors file with changed metadata, a tensor dropped or replaced."""
    tensors, old = load_safetensors_with_metadata(path)  # a copy in memory: the file may be replaced
    if drop is not None:
        del tensors[drop]
    tensors.update(replace or {})
    save_safetensors(tensors, path, metadata={**(old or {}), **(meta or {})})


@pytest.fixture
def quantized_dir(checkpoints: dict[str, tuple[Path, Any]], tmp_path: Path) -> Path:
    from_pretrained(checkpoints["llama"][0], weights="q8_0").save_pretrained(tmp_path)
    return tmp_path


def _spec(d: Path) -> dict[str, Any]:
    _, meta = load_safetensors_with_metadata(d / "model.safetensors")
    assert meta is not None
    out: dict[str, Any] = json.loads(meta[QUANTIZATION_KEY])
    return out


KEY = "model.layers.0.mlp.down_proj.weight"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: "{not json", r"metadata 'kael.quantization' is not JSON"),
        (lambda s: json.dumps({**s, "version": 2}), r'expected \{"version": 1, "tensors"'),
        (lambda s: json.dumps([1]), r'expected \{"version": 1, "tensors"'),
        (
            lambda s: json.dumps({**s, "tensors": {**s["tensors"], KEY: {"scheme": "q7_0", "shape": [64, 128]}}}),
            rf"tensor '{KEY}' has scheme 'q7_0', expected one of",
        ),
        (
            lambda s: json.dumps({**s, "tensors": {**s["tensors"], KEY: {"scheme": "q8_0", "shape": [64, 100]}}}),
            rf"tensor '{KEY}' has shape \[64, 100\]; q8_0 needs in_features a multiple of 32",
        ),
        (
            lambda s: json.dumps({**s, "tensors": {**s["tensors"], KEY: {"scheme": "q8_0", "shape": [64]}}}),
            rf"tensor '{KEY}' has shape \[64\], expected \[out, in\]",
        ),
        (
            lambda s: json.dumps({**s, "tensors": {**s["tensors"], KEY: {"scheme": "q8_0", "shape": [64, 256]}}}),
            rf"gives '{KEY}' the shape \[64, 256\], the model's module is \[64, 128\]",
        ),
        (
            lambda s: json.dumps({**s, "tensors": {**s["tensors"], KEY: {"scheme": "q4_0", "shape": [64, 128]}}}),
            rf"'{KEY}' is uint8 \[64, 136\], its quantization metadata needs uint8 \[64, 72\]",
        ),
        (
            lambda s: json.dumps(
                {**s, "tensors": {**s["tensors"], "model.norm.weight": {"scheme": "q8_0", "shape": [64, 64]}}}
            ),
            r"names 'model.norm.weight', which is not a projection or token table",
        ),
        (
            lambda s: json.dumps(
                {**s, "tensors": {**s["tensors"], "model.bogus.weight": {"scheme": "q8_0", "shape": [64, 64]}}}
            ),
            r"names 'model.bogus.weight', which is no module of the model",
        ),
        (
            lambda s: json.dumps(
                {**s, "tensors": {**s["tensors"], KEY: {"scheme": "q8_0", "shape": [64, 128], "x": 1}}}
            ),
            rf"tensor '{KEY}' must be",
        ),
    ],
)
def test_malformed_quantization_metadata_is_a_format_error(quantized_dir: Path, change: Any, message: str) -> None:
    _rewrite(quantized_dir / "model.safetensors", meta={QUANTIZATION_KEY: change(_spec(quantized_dir))})
    with pytest.raises(kael.FormatError, match=message) as info:
        from_pretrained(quantized_dir)
    assert "model.safetensors" in str(info.value)


def test_metadata_naming_a_missing_tensor_is_a_format_error(quantized_dir: Path) -> None:
    _rewrite(quantized_dir / "model.safetensors", drop=KEY)
    with pytest.raises(kael.FormatError, match=rf"missing tensor '{KEY}'") as info:
        from_pretrained(quantized_dir)
    assert str(quantized_dir) in str(info.value)


def test_a_quantized_tensor_of_the_wrong_bytes_or_dtype_is_a_format_error(quantized_dir: Path) -> None:
    _rewrite(quantized_dir / "model.safetensors", replace={KEY: kael.zeros(64, 3 * 34, dtype=kael.uint8)})
    with pytest.raises(
        kael.FormatError, match=rf"'{KEY}' is uint8 \[64, 102\], its quantization metadata needs uint8 \[64, 136\]"
    ):
        from_pretrained(quantized_dir)
    _rewrite(quantized_dir / "model.safetensors", replace={KEY: kael.zeros(64, 4 * 34, dtype=kael.float32)})
    with pytest.raises(
        kael.FormatError, match=rf"'{KEY}' is float32 \[64, 136\], its quantization metadata needs uint8"
    ):
        from_pretrained(quantized_dir)


def test_a_block_tensor_without_metadata_is_a_format_error(quantized_dir: Path) -> None:
    tensors, old = load_safetensors_with_metadata(quantized_dir / "model.safetensors")
    assert old is not None
    meta = {k: v for k, v in old.items() if k not in (QUANTIZATION_KEY, WEIGHTS_KEY)}
    save_safetensors(tensors, quantized_dir / "model.safetensors", metadata=meta)
    with pytest.raises(kael.FormatError, match="model.layers.0"):
        from_pretrained(quantized_dir)


def test_a_quantized_gpt2_checkpoint_is_checked_too(checkpoints: dict[str, tuple[Path, Any]], tmp_path: Path) -> None:
    from_pretrained(checkpoints["gpt2"][0], weights="q4_0").save_pretrained(tmp_path)
    key = "transformer.h.1.mlp.c_fc.weight"
    _rewrite(tmp_path / "model.safetensors", replace={key: kael.zeros(256, 2 * 18 - 1, dtype=kael.uint8)})
    with pytest.raises(kael.FormatError, match=rf"'{key}' has shape \[256, 35\], the model expects \[256, 36\]"):
        from_pretrained(tmp_path)
    _rewrite(tmp_path / "model.safetensors", drop=key)
    with pytest.raises(kael.FormatError, match=rf"missing key\(s\) \['{key}'\]"):
        from_pretrained(tmp_path)


# -- the bundled models' held-out loss (the READMEs' measurement) ----------------------------------
def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_kael_tiny_held_out_loss_in_q8_0_and_q4_0() -> None:
    """kael-tiny's README: 0.8797 nats/byte on the held-out files (train_gpt.py's final evaluate:
    16 batches of 16 x 128 from a 12 MB corpus, seed 1234). Q8_0 may add at most 0.5%, Q4_0 3%."""
    pytest.importorskip("tqdm")
    from kael_server.loading import bundled_model_dir

    train_gpt = _example("train_gpt")
    _, held = train_gpt.load_corpus(int(12.0 * 1e6))
    d = bundled_model_dir("kael-tiny")
    loss = {w: train_gpt.evaluate(from_pretrained(d, weights=w), held, 16, 16, 128) for w in (None, "q8_0", "q4_0")}
    assert loss[None] == pytest.approx(0.8797, abs=5e-5)  # the README's figure: the same text
    assert loss["q8_0"] <= loss[None] * 1.005
    assert loss["q4_0"] <= loss[None] * 1.03
    assert loss["q4_0"] != loss[None]  # the weights really changed


def test_kael_tiny_chat_held_out_loss_in_q8_0_and_q4_0() -> None:
    """kael-tiny-chat's README: 2.6741 nats/token on the assistant tokens of the held-out
    conversations (train_llama.py's final evaluate: 16 batches of 16 x 256, seed 1234)."""
    pytest.importorskip("tqdm")
    tokenizers = pytest.importorskip("tokenizers")
    from kael_server.loading import bundled_model_dir

    train_llama = _example("train_llama")
    d = bundled_model_dir("kael-tiny-chat")
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    held = train_llama.encode_examples(tok, [e for e in train_llama.conversations(800) if e.held_out], 256)
    loss = {w: train_llama.evaluate(from_pretrained(d, weights=w), held, 16, 16, 256) for w in (None, "q8_0", "q4_0")}
    assert loss[None] == pytest.approx(2.6741, abs=5e-5)
    assert loss["q8_0"] <= loss[None] * 1.005
    assert loss["q4_0"] <= loss[None] * 1.03
    assert loss["q4_0"] != loss[None]


# -- python -m kael generate / chat --weights ----------------------------------------------------------
def test_cli_generate_with_weights(capsys: pytest.CaptureFixture[str]) -> None:
    from kael.__main__ import main
    from kael.models._cli import stop_ids
    from kael.tokenizer import load_tokenizer
    from kael_server.loading import bundled_model_dir

    d = bundled_model_dir("kael-tiny")
    tok = load_tokenizer(d)
    model = from_pretrained(d, weights="q4_0")
    ids = model.generate(tok.encode("def "), 24)
    stops = stop_ids(model, tok)
    cut = next((i for i, t in enumerate(ids) if t in stops), len(ids))
    assert main(["generate", "--model", str(d), "--weights", "q4_0", "--max-tokens", "24", "def "]) == 0
    assert capsys.readouterr().out == tok.decode_text(ids[:cut]) + "\n"
    with pytest.raises(SystemExit) as info:
        main(["generate", "--model", str(d), "--weights", "q7_0", "x"])
    assert info.value.code == 2
    assert "invalid choice: 'q7_0'" in capsys.readouterr().err


def test_cli_chat_with_weights(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from kael.__main__ import main
    from kael.models import _registry
    from kael_server.loading import bundled_model_dir

    loaded: list[Any] = []
    real = _registry.from_pretrained

    def spy(*args: Any, **kwargs: Any) -> Any:
        loaded.append(real(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(_registry, "from_pretrained", spy)
    d = bundled_model_dir("kael-tiny-chat")
    monkeypatch.setattr(sys, "stdin", io.StringIO("Write a Python function `add(a, b)`.\n"))
    assert main(["chat", "--model", str(d), "--weights", "q8_0", "--max-tokens", "16"]) == 0
    assert capsys.readouterr().out.strip()
    assert [m.weights_scheme for m in loaded] == ["q8_0"]
    assert isinstance(loaded[0].model.layers[0].self_attn.q_proj, QuantizedLinear)
