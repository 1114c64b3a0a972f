"""kael.quantize and QuantizedLinear on small models built from kael.nn layers.

* Modules swapped in their parents (state_dict keys kept, in order), ``skip`` honoured with
  everything under a skipped name, a layer whose in_features is not a multiple of 32 left
  float32 for the block schemes (and quantized for bf16 / f16), tied modules one layer.
* The quantized model's output equals a float64 NumPy forward over the dequantized weights
  (within float32 accumulation), and stays within the stated quantization noise of the float
  model: relative RMS error below 2% for q8_0, 15% for q4_0, 1% for bf16, 0.1% for f16.
* ``as_linear`` modules ([in, out] storage, like GPT-2's Conv1D), the ``quantize_embeddings``
  and ``on_quantized`` hooks, ``weights_scheme``; state_dict round trips; training through a
  quantized layer (a float adapter before it gets the gradient NumPy computes).
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
from kael import nn
from kael.quant import BLOCK_BYTES, QuantizedLinear, dequantize_array, quantizable, quantize_array

#: float oracles (NumPy, float64): quantized linears on float32 activations (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("float_activations_module")

NOISE = {
    "q8_0": 0.02, "q4_0": 0.15, "q4_1": 0.15, "q5_0": 0.08, "q5_1": 0.08, "bf16": 0.01, "f16": 0.001,
    "q2_k": 0.6, "q3_k": 0.3, "q4_k": 0.15, "q5_k": 0.08, "q6_k": 0.04, "iq4_nl": 0.15, "iq4_xs": 0.15,
}  # fmt: skip


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d, bias=False)

    def forward(self, x: kael.Tensor) -> kael.Tensor:
        return self.down(kael.relu(self.up(x)))


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(40, 64)  # in_features 40: no whole 32-value blocks
        self.blocks = nn.ModuleList([Block(64), Block(64)])
        self.head = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x: kael.Tensor) -> kael.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = h + b(h)
        return self.head(h)


def _numpy_forward(model: Tiny, x: np.ndarray) -> np.ndarray:
    """The model's forward in float64 NumPy over the float values each layer now holds."""

    def lin(m: Any, v: np.ndarray) -> np.ndarray:
        if isinstance(m, QuantizedLinear):
            w = dequantize_array(_bits(m.weight), m.scheme, m.in_features).astype(np.float64)
        else:
            w = m.weight.detach().numpy().astype(np.float64)
        y = v @ w.T
        return y if m.bias is None else y + m.bias.detach().numpy()

    h = lin(model.inp, x.astype(np.float64))
    for b in model.blocks:
        h = h + lin(b.down, np.maximum(lin(b.up, h), 0))
    return lin(model.head[2], np.maximum(lin(model.head[0], h), 0))


def _bits(t: kael.Tensor) -> np.ndarray:
    return t.view(kael.int16).numpy().view(np.uint16) if t.dtype is kael.bfloat16 else t.numpy()


@pytest.mark.parametrize("scheme", quantizable())
def test_quantize_swaps_projections_and_keeps_outputs_within_noise(scheme: str) -> None:
    kael.manual_seed(0)
    model = Tiny()
    x = np.random.default_rng(1).standard_normal((5, 40)).astype(np.float32)
    before = model(kael.tensor(x)).detach().numpy().astype(np.float64)
    keys = list(model.state_dict())
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    assert kael.quantize(model, scheme, skip=("blocks.1",)) is model
    assert list(model.state_dict()) == keys  # same keys, same order
    assert model.weights_scheme == scheme
    block = scheme in BLOCK_BYTES
    assert isinstance(model.inp, QuantizedLinear) != block  # 40 inputs: float32 for the block schemes
    used = set()
    for name in ("blocks.0.up", "blocks.0.down", "head.0", "head.2"):
        m = model.get_submodule(name) if hasattr(model, "get_submodule") else _get(model, name)
        # rows of 32..128 values: the K-quants' 256-value blocks do not fit; llama.cpp's fallback format then
        want = FALLBACK.get(scheme, scheme)
        assert isinstance(m, QuantizedLinear) and m.scheme == want, (name, m)
        used.add(want)
        np.testing.assert_array_equal(_bits(m.weight), quantize_array(weights[name + ".weight"], want))
        if m.bias is not None:
            assert m.bias.dtype is kael.float32
            np.testing.assert_array_equal(m.bias.numpy(), weights[name + ".bias"])
    assert type(model.blocks[1].up) is nn.Linear and type(model.blocks[1].down) is nn.Linear  # skipped subtree
    after = model(kael.tensor(x)).detach().numpy()
    want = _numpy_forward(model, x)
    np.testing.assert_allclose(after, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    rel = np.sqrt(np.mean((after - before) ** 2)) / np.sqrt(np.mean(before**2))
    assert rel < max(NOISE[u] for u in used), rel
    assert rel > 0 or scheme == "f16"


FALLBACK = {"q2_k": "q4_0", "q3_k": "q4_0", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0", "iq4_xs": "iq4_nl"}
"""llama.cpp's ``tensor_type_fallback`` (src/llama-quant.cpp) for rows the 256-value blocks do not fit."""


class Wide(nn.Module):
    """Rows of 256 and 512 values, which every block format fits."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(256, 512)
        self.down = nn.Linear(512, 256, bias=False)

    def forward(self, x: kael.Tensor) -> kael.Tensor:
        return self.down(kael.relu(self.up(x)))


@pytest.mark.parametrize("scheme", ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs", "iq4_nl"])
def test_k_quants_and_iq4_quantize_rows_of_256(scheme: str) -> None:
    """Each projection in the format; its values are the ``gguf`` package's dequantization of its blocks,
    and the model computes with those values (NumPy float64)."""
    gguf = pytest.importorskip("gguf")
    kael.manual_seed(4)
    model = Wide()
    x = np.random.default_rng(2).standard_normal((3, 256)).astype(np.float32)
    before = model(kael.tensor(x)).detach().numpy().astype(np.float64)
    kael.quantize(model, scheme)
    qtype = getattr(gguf.GGMLQuantizationType, scheme.upper())
    ws = {}
    for name in ("up", "down"):
        m = getattr(model, name)
        assert isinstance(m, QuantizedLinear) and m.scheme == scheme
        ws[name] = gguf.quants.dequantize(m.weight.numpy(), qtype).astype(np.float64)
        assert ws[name].shape == (m.out_features, m.in_features)
    after = model(kael.tensor(x)).detach().numpy()
    h = np.maximum(x.astype(np.float64) @ ws["up"].T + model.up.bias.numpy(), 0)
    want = h @ ws["down"].T
    np.testing.assert_allclose(after, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    rel = np.sqrt(np.mean((after - before) ** 2)) / np.sqrt(np.mean(before**2))
    assert 0 < rel < NOISE[scheme], rel


def test_a_mix_on_a_model_without_a_plan_is_its_base_format() -> None:
    """A module kael has no GGUF layout for has no attn_v/ffn_down to favour: a mix is its base format."""
    kael.manual_seed(6)
    model = Wide()
    kael.quantize(model, "q4_k_m")
    assert model.weights_scheme == "q4_k_m"
    assert (model.up.scheme, model.down.scheme) == ("q4_k", "q4_k")


def _get(model: nn.Module, name: str) -> Any:
    m: Any = model
    for part in name.split("."):
        m = getattr(m, part)
    return m


def test_tied_module_becomes_one_quantized_layer() -> None:
    shared = nn.Linear(32, 32)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    kael.quantize(model, "q8_0")
    assert isinstance(model[0], QuantizedLinear) and model[0] is model[2]


class Conv1DLike(nn.Module):
    """GPT-2's layout: weight [in, out]; as_linear gives the [out, in] view."""

    def __init__(self, nx: int, nf: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(kael.randn(nx, nf))
        self.bias = nn.Parameter(kael.randn(nf))

    def forward(self, x: kael.Tensor) -> kael.Tensor:
        return x @ self.weight + self.bias

    def as_linear(self) -> tuple[kael.Tensor, kael.Tensor | None]:
        return self.weight.T, self.bias


class WithHooks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_attn = Conv1DLike(64, 96)
        self.calls: list[str] = []

    def forward(self, x: kael.Tensor) -> kael.Tensor:
        return self.c_attn(x)

    def quantize_embeddings(self, scheme: str) -> None:
        self.calls.append(f"embeddings:{scheme}:{type(self.c_attn).__name__}")

    def on_quantized(self) -> None:
        self.calls.append(f"on_quantized:{self.weights_scheme}")


def test_as_linear_modules_and_the_family_hooks() -> None:
    kael.manual_seed(3)
    model = WithHooks()
    w = model.c_attn.weight.detach().numpy().copy()
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    kael.quantize(model, "q4_0", embeddings=True)
    assert isinstance(model.c_attn, QuantizedLinear) and (model.c_attn.in_features, model.c_attn.out_features) == (
        64,
        96,
    )
    np.testing.assert_array_equal(model.c_attn.weight.numpy(), quantize_array(np.ascontiguousarray(w.T), "q4_0"))
    assert model.calls == ["embeddings:q4_0:QuantizedLinear", "on_quantized:q4_0"]
    y = model(kael.tensor(x)).numpy()
    wq = dequantize_array(quantize_array(np.ascontiguousarray(w.T), "q4_0"), "q4_0", 64)
    np.testing.assert_allclose(y, x @ wq.T + model.c_attn.bias.numpy(), rtol=1e-4, atol=1e-4)
    plain = WithHooks()
    kael.quantize(plain, "q8_0")  # embeddings=False: only on_quantized
    assert plain.calls == ["on_quantized:q8_0"]


def test_state_dict_round_trip_into_an_empty_layer() -> None:
    kael.manual_seed(5)
    lin = nn.Linear(256, 24)
    for scheme in quantizable():
        q = QuantizedLinear.from_float(lin.weight, lin.bias, scheme)
        empty = QuantizedLinear(256, 24, scheme)
        assert {k: (v.dtype, v.shape) for k, v in empty.state_dict().items()} == {
            k: (v.dtype, v.shape) for k, v in q.state_dict().items()
        }
        empty.load_state_dict(q.state_dict())
        x = kael.randn(3, 256)
        np.testing.assert_array_equal(empty(x).numpy(), q(x).numpy())
    nobias = QuantizedLinear(32, 8, "q8_0", bias=False)
    assert list(nobias.state_dict()) == ["weight"] and nobias.bias is None


def test_a_quantized_linear_built_around_stored_bytes_holds_them() -> None:
    # weight=: the loaders' way in, no zeros made first; the layer holds that very tensor and computes what
    # from_float's layer of the same bytes computes
    kael.manual_seed(7)
    lin = nn.Linear(256, 16)
    for scheme in quantizable():
        ref = QuantizedLinear.from_float(lin.weight, None, scheme)
        stored = ref.weight.clone()
        q = QuantizedLinear(256, 16, scheme, bias=False, weight=stored)
        assert q.weight is stored and q.bias is None
        x = kael.randn(3, 256)
        np.testing.assert_array_equal(q(x).numpy(), ref(x).numpy())


def test_from_float_takes_16_bit_weights() -> None:
    kael.manual_seed(6)
    w = kael.randn(8, 64).to(kael.bfloat16)
    q = QuantizedLinear.from_float(w, None, "q8_0")
    np.testing.assert_array_equal(q.weight.numpy(), quantize_array(w.float().numpy(), "q8_0"))


def test_training_through_a_quantized_layer() -> None:
    """A float adapter in front of a frozen quantized layer gets dL/dA = (W^T g)^T x, as NumPy computes."""
    kael.manual_seed(7)
    adapter = nn.Linear(32, 64, bias=False)
    frozen = QuantizedLinear.from_float(kael.randn(16, 64), kael.randn(16), "q8_0")
    x = np.random.default_rng(2).standard_normal((4, 32)).astype(np.float32)
    out = frozen(adapter(kael.tensor(x)))
    out.sum().backward()
    assert adapter.weight.grad is not None
    w = dequantize_array(frozen.weight.numpy(), "q8_0", 64).astype(np.float64)
    g_h = np.ones((4, 16)) @ w  # dL/dh, h = adapter(x)
    np.testing.assert_allclose(adapter.weight.grad.numpy(), g_h.T @ x, rtol=1e-4, atol=1e-4)
    assert not any(t.requires_grad for t in frozen.state_dict().values())


@pytest.mark.parametrize(
    ("call", "err", "match"),
    [
        (lambda: kael.quantize(Tiny(), "f32"), kael.DTypeError, "quantize: unknown weight scheme 'f32'.*q4_k_m"),
        (lambda: kael.quantize(Tiny(), "Q4_K_M"), kael.DTypeError, "quantize: unknown weight scheme 'Q4_K_M'"),
        (lambda: kael.quantize(Tiny(), "q7_0"), kael.DTypeError, "quantize: unknown weight scheme 'q7_0'"),
        (lambda: kael.quantize(object(), "q8_0"), kael.DTypeError, "expected a kael.nn.Module, got object"),
        (lambda: kael.quantize(Tiny(), "q8_0", skip="head"), kael.DTypeError, "got the string 'head'"),
        (lambda: kael.quantize(nn.Linear(32, 4), "q8_0"), kael.ShapeError, "the model itself is a projection"),
        (lambda: QuantizedLinear(40, 4, "q4_0"), kael.ShapeError, "multiple of 32, got 40"),
        (lambda: QuantizedLinear(-1, 4, "f16"), kael.ShapeError, "in_features must be a non-negative int"),
        (lambda: QuantizedLinear(32, 4, "int4"), kael.DTypeError, "unknown weight scheme 'int4'"),
        (
            lambda: QuantizedLinear(32, 4, "q8_0", weight=kael.zeros(4, 34)),
            kael.DTypeError,
            "a q8_0 weight is a kael.uint8 tensor of its stored bytes, got kael.float32",
        ),
        (
            lambda: QuantizedLinear(32, 4, "q8_0", weight=kael.zeros(4, 32, dtype=kael.uint8)),
            kael.ShapeError,
            r"a q8_0 weight of 4 x 32 is stored as \[4, 34\], got \[4, 32\]",
        ),
        (lambda: QuantizedLinear(32, 4, "f16", weight=object()), kael.DTypeError, "got object"),
        (
            lambda: QuantizedLinear.from_float(kael.zeros(4, 32, dtype=kael.int32), None, "q8_0"),
            kael.DTypeError,
            "floating-point tensor",
        ),
        (lambda: QuantizedLinear.from_float(kael.zeros(4, 32), kael.zeros(5), "q8_0"), kael.ShapeError, r"\[4\]"),
    ],
)
def test_bad_input_is_a_clear_error(call: Any, err: type, match: str) -> None:
    with pytest.raises(err, match=match):
        call()


def test_quantizing_again_same_scheme_is_a_no_op_other_scheme_an_error() -> None:
    kael.manual_seed(8)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
    kael.quantize(model, "q8_0")
    first = model[0]
    kael.quantize(model, "q8_0")
    assert model[0] is first
    with pytest.raises(kael.DTypeError, match="'0' is already quantized to q8_0"):
        kael.quantize(model, "q4_0")
    assert model[0] is first and model.weights_scheme == "q8_0"


def test_kael_quantize_is_kael_quant_quantize() -> None:
    assert kael.quantize is kael.quant.quantize


def test_quantize_array_goes_a_slab_of_rows_at_a_time_with_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rows are independent: slabs of 3 rows (a 1 KiB budget over 256-value rows) give the bytes of the whole
    # array at once, and gguf's quantizer's where it has one.
    import kael.quant._formats as formats

    gguf_quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType as Q

    x = np.random.default_rng(3).standard_normal((11, 256)).astype(np.float32)
    whole = {s: quantize_array(x, s) for s in quantizable() if s in BLOCK_BYTES}
    monkeypatch.setattr(formats, "_CHUNK_BYTES", 3 * 256 * 4)
    for scheme, want in whole.items():
        got = quantize_array(x, scheme)
        assert got.dtype == want.dtype and got.shape == want.shape, scheme
        np.testing.assert_array_equal(got, want, err_msg=scheme)
        if scheme in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"):
            np.testing.assert_array_equal(got, gguf_quants.quantize(x, Q[scheme.upper()]), err_msg=scheme)
