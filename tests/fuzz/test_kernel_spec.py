"""fuzz/kernel_spec.py is made from the op catalogue, and its encoding stays stable.

* Every elementwise op of the catalogue is fuzzed, with the dtypes and value domains of
  its ``Pointwise`` entry; the ops of the first encoding keep their positions.
* The weight-format ops are fuzzed on every scheme of the format registry, in GGML type
  id order; hand-written bytes decode to the calls the encoding promises.
* Every saved kernel input names its op by its index (the op byte is below ``len(OPS)``),
  so appending an op to OPS never turns a saved input into another call.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from kael.backends import catalogue, dtypes
from kael.quant import SCHEMES, dequantize_array
from kael.quant.formats import FORMATS

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"
if str(FUZZ) not in sys.path:
    sys.path.insert(0, str(FUZZ))

import kernel_spec as ks  # noqa: E402

# The ops of the first encoding, in order (the committed seeds and regressions depend on them).
FIRST_ENCODING = (
    *("add", "sub", "mul", "div", "pow", "maximum", "minimum", "remainder", "floor_divide"),
    *("neg", "exp", "log", "sqrt", "rsqrt", "tanh", "abs", "sin", "cos", "sigmoid", "erf", "log1p", "expm1"),
    *("floor", "ceil", "round", "sign", "logical_not"),
    *("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"),
    *("copy", "fill", "arange", "where", "matmul", "cat", "index_select", "gather"),
    *("sum", "prod", "amax", "amin", "argmax", "argmin", "any", "all"),
    *("softmax", "log_softmax", "layer_norm", "gelu"),
)
# Then silu (the catalogue's first fused elementwise op) and the weight-format ops.
SECOND_ENCODING = (*FIRST_ENCODING, "silu", "dequantize", "quantized_linear")


def test_ops_keep_the_first_encoding_and_append_the_catalogues_new_elementwise_ops() -> None:
    assert ks.OPS[: len(SECOND_ENCODING)] == SECOND_ENCODING
    assert set(catalogue.POINTWISE_OPS) <= set(ks.OPS)
    assert catalogue.POINTWISE_FUSED[0] == "silu"
    assert ks.OPS[len(SECOND_ENCODING) :] == catalogue.POINTWISE_FUSED[1:]
    assert len(set(ks.OPS)) == len(ks.OPS)
    assert all(catalogue.op(op).kind == "fused" for op in ks.QUANT)


def test_quant_schemes_are_the_registrys_in_ggml_type_order() -> None:
    assert sorted(ks.QUANT_SCHEMES) == sorted(SCHEMES) and "f32" not in ks.QUANT_SCHEMES
    ids = [FORMATS[s].ggml_type for s in ks.QUANT_SCHEMES]
    assert ids == sorted(ids) and ids[:3] == [1, 2, 3]  # F16, Q4_0, Q4_1: GGML's first ids
    assert ks.QUANT_SCHEMES[ids.index(8)] == "q8_0" and ks.QUANT_SCHEMES[-1] == "bf16"  # BF16 is type 30


def test_dequantize_bytes_decode_to_the_call() -> None:
    q4k = ks.QUANT_SCHEMES.index("q4_k")
    # op, dtype, flags, scheme, N = 17, blocks (index 1: two), weight byte 1 (quantized), layouts, seed
    data = bytes([ks.OPS.index("dequantize"), 0, 0, q4k, 17, 1, 1]) + bytes(6) + b"\x07\0\0\0"
    case = ks.decode(data)
    assert case.op == "dequantize" and case.dtype is dtypes.float32 and case.exact and not case.raw
    out, weight, scheme = case.args
    assert scheme == "q4_k"
    assert (out.shape, out.dtype, out.role) == ((17, 512), dtypes.float32, "out")
    assert (weight.shape, weight.dtype, weight.role, weight.kind) == ((17, 2 * 144), dtypes.uint8, "in", "quantized")
    assert case.seed == 7
    assert data == ks.encode_quant("dequantize", "q4_k", 17, 2, quantized=True, extra=bytes(6) + b"\x07\0\0\0")


def test_quantized_linear_bytes_decode_to_the_call() -> None:
    q8 = ks.QUANT_SCHEMES.index("q8_0")
    # scheme, N = 40, blocks index 2 (three), random blocks, 5 rows, form 2 ([2, 2, K]), bias + repack 1/0
    data = bytes([ks.OPS.index("quantized_linear"), 0, 0, q8, 40, 2, 0, 5, 2, 0b011])
    case = ks.decode(data + bytes(12))
    out, x, weight, bias, scheme = case.args
    assert case.op == "quantized_linear" and scheme == "q8_0" and not case.exact
    assert out.shape == (2, 2, 40) and out.role == "out" and out.dtype is dtypes.float32
    assert x.shape == (2, 2, 96) and x.dtype is dtypes.float32 and x.kind == "unit"
    assert (weight.shape, weight.dtype, weight.kind) == ((40, 3 * 34), dtypes.uint8, "blocks")
    assert bias is not None and bias.shape == (40,) and bias.dtype is dtypes.float32
    assert case.repack == (True, False)
    assert "KAEL_REPACK 1/0" in case.describe() and "(random blocks)" in case.describe()
    one_row = ks.decode(bytes([ks.OPS.index("quantized_linear"), 0, 1, q8, 3, 6, 1, 9, 1, 0]))
    assert one_row.raw and one_row.args[1].shape == (0,) and one_row.args[0].shape == (3,)  # form 1: x [K], K = 0
    assert one_row.args[3] is None and one_row.repack == (False, False)
    assert data == ks.encode_quant("quantized_linear", "q8_0", 40, 3, 5, form=2, bias=True, repack=(True, False))


@pytest.mark.parametrize("scheme", ["bf16", "f16"])
def test_float_weights_are_their_dtype_n_by_k(scheme: str) -> None:
    case = ks.decode(ks.encode_quant("quantized_linear", scheme, 5, 3, 2, tail=7))
    weight = case.args[2]
    assert (
        weight.shape == (5, 89)
        and case.args[1].shape == (2, 89)
        and weight.dtype is dtypes.BY_NAME[{"bf16": "bfloat16", "f16": "float16"}[scheme]]
    )
    assert weight.kind == "normal"


def test_tame_weights_never_broadcast_and_raw_ones_may() -> None:
    """A broadcast byte would stand for many: tame blocks could not stay valid (a NaN scale)."""
    layouts = bytes(3) + b"\x00\xff\x00"  # out dense; weight code 0xff: step code 3 on both dims
    tame = ks.decode(ks.encode_quant("dequantize", "q8_0", 4, 1, extra=layouts))
    raw = ks.decode(ks.encode_quant("dequantize", "q8_0", 4, 1, raw=True, extra=layouts))
    assert tame.args[1].layout.steps == (3, 3) and raw.args[1].layout.steps == (0, 0)


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if FORMATS[s].blocked])
def test_tame_random_blocks_decode_to_moderate_finite_values(scheme: str) -> None:
    if not _has_cpu_backend():
        pytest.skip("fuzz_kernels needs the C++ backend (kael-backend-cpu)")
    import fuzz_kernels

    fmt = FORMATS[scheme]
    data = fuzz_kernels._weight_bytes(np.random.default_rng(3), scheme, (5, 2 * fmt.block_bytes), "blocks")
    values = dequantize_array(data, scheme, 2 * fmt.block_values)
    assert data.shape == (5, 2 * fmt.block_bytes) and data.dtype == np.uint8
    assert np.isfinite(values).all() and np.abs(values).max() < fuzz_kernels.MODERATE
    assert len(np.unique(data)) > 64  # random bytes, not the all-zero fallback


@pytest.mark.parametrize("op", catalogue.POINTWISE_OPS)
def test_elementwise_cases_follow_the_catalogue(op: str) -> None:
    p = catalogue.op(op).pointwise
    assert p is not None
    for d in ks._dtypes(op):
        case = ks.decode(ks.encode_case(op, d.name, (2, 3)))
        assert case.op == op and case.dtype is d
        out, *ins = case.args
        assert len(ins) == catalogue.op(op).arity[1]
        assert out.role == "out" and out.dtype is (dtypes.bool_ if p.bool_out else d)
        assert [t.kind for t in ins] == list((p.kinds(d.category == dtypes.INTEGER) * 2)[: len(ins)])
        raw = ks.decode(ks.encode_case(op, d.name, (2, 3), raw=True))
        assert raw.exact == (p.exact == "all" or (p.exact == "ints" and not d.is_floating_point))
    if p.dtypes == "float":
        assert all(d.is_floating_point for d in ks._dtypes(op))


def test_silu_decodes_to_a_unary_float_case() -> None:
    case = ks.decode(ks.encode_case("silu", "bfloat16", (4, 3), extra=bytes(3) + b"\x01\x00\x01"))
    assert case.op == "silu" and case.dtype is dtypes.bfloat16 and not case.exact
    assert case.describe().startswith("silu (bfloat16, tame): out bfloat16[4, 3]")


@pytest.mark.parametrize("folder", ["corpus", "regressions"])
def test_saved_inputs_name_their_op_by_index(folder: str) -> None:
    saved = sorted((FUZZ / folder / "fuzz_kernels").iterdir())
    assert saved
    for path in saved:
        data = path.read_bytes()
        assert data and data[0] < len(ks.OPS) and ks.decode(data).op == ks.OPS[data[0]], path.name


def test_a_reduced_dim_grown_from_0_to_1_keeps_the_size_bound() -> None:
    """argmax over an empty dim: the dim becomes 1, which must not lift the other dims past MAX_NUMEL.

    Found by fuzz_kernels as a slow unit (8.5M elements: 14 s under ASan). The found input's op
    byte was 103 ("g"), argmax modulo the OPS of then; it is written as argmax's index here, so
    appending to OPS keeps the case.
    """
    case = ks.decode(bytes([ks.OPS.index("argmax")]) + b"r\xff\xff\xff\xff\xff\x00gr\xff\xff\xff\x00e")
    assert case.op == "argmax"
    n_in = int(np.prod(case.args[1].shape))
    assert 0 < n_in <= ks.MAX_NUMEL and case.args[0].shape[3] == 1


def _has_cpu_backend() -> bool:
    from kael.backends import available

    return "cpu" in {b.name for b in available()}
