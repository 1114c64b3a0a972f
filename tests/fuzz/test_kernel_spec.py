"""fuzz/kernel_spec.py is made from the op catalogue, and its encoding stays stable.

* Every elementwise op of the catalogue is fuzzed, with the dtypes and value domains of
  its ``Pointwise`` entry; the ops of the first encoding keep their positions.
* Every saved kernel input names its op by its index (the op byte is below ``len(OPS)``),
  so appending an op to OPS never turns a saved input into another call.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from kael.backends import catalogue, dtypes

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


def test_ops_keep_the_first_encoding_and_append_the_catalogues_new_elementwise_ops() -> None:
    assert ks.OPS[: len(FIRST_ENCODING)] == FIRST_ENCODING
    assert set(catalogue.POINTWISE_OPS) <= set(ks.OPS)
    assert ks.OPS[len(FIRST_ENCODING) :] == catalogue.POINTWISE_FUSED
    assert len(set(ks.OPS)) == len(ks.OPS)


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

    Found by fuzz_kernels as a slow unit (8.5M elements: 14 s under ASan).
    """
    case = ks.decode(b"gr\xff\xff\xff\xff\xff\x00gr\xff\xff\xff\x00e")
    assert case.op == "argmax"
    n_in = int(np.prod(case.args[1].shape))
    assert 0 < n_in <= ks.MAX_NUMEL and case.args[0].shape[3] == 1
