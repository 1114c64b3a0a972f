"""The Llama family's grouped-query attention against independent oracles.

``kael.attention`` with fewer key/value heads than query heads (causal or not, with per-row
lengths) against PyTorch's ``scaled_dot_product_attention(..., enable_gqa=True)``, forward and
with its gradients; against attention over key/value heads repeated by hand (Hugging Face's
repeat_kv); the ``enable_gqa`` flag of ``scaled_dot_product_attention`` as PyTorch has it; and
head counts that do not divide, named in the error. Runs on the default CPU backend, on the
reference backend's fused kernels and as the decomposition on a backend without fused kernels
(``mode``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kael
import numpy as np
import pytest
from llama_ops_common import MODES, backend_mode
from llama_ops_common import float64_of as _np
from llama_ops_common import tensor_of as _t


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """The CPU backend as installed, the reference backend (fused host kernels), and one without fused kernels."""
    with backend_mode(request.param) as name:
        yield name


# -- grouped-query attention ----------------------------------------------------------------------


def _torch_mask(torch: Any, b: int, tq: int, tk: int, causal: bool, lengths: list[int] | None) -> Any:
    m = torch.ones(b, 1, tq, tk, dtype=torch.bool)
    if causal:  # kael aligns the last query with the last key
        m &= torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=tk - tq)
    if lengths is not None:
        m &= (torch.arange(tk)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]
    return m


@pytest.mark.parametrize(
    ("heads", "kv_heads", "tq", "tk", "causal", "lengths"),
    [
        (4, 2, 3, 5, False, None),
        (4, 1, 3, 5, True, None),
        (6, 3, 1, 6, True, [6, 4]),
        (4, 4, 2, 5, True, [5, 3]),
        (8, 2, 4, 4, True, None),
    ],
)
def test_gqa_attention_matches_torch_enable_gqa(
    heads: int, kv_heads: int, tq: int, tk: int, causal: bool, lengths: list[int] | None, mode: str
) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(heads * 100 + kv_heads * 10 + tq)
    q = rng.standard_normal((2, heads, tq, 4))
    k, v = rng.standard_normal((2, kv_heads, tk, 4)), rng.standard_normal((2, kv_heads, tk, 3))
    kq, kk, kv = _t(q, True), _t(k, True), _t(v, True)
    ln = kael.tensor(lengths) if lengths is not None else None
    y = kael.attention(kq, kk, kv, causal=causal, lengths=ln)
    tq_, tk_, tv_ = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    ty = torch.nn.functional.scaled_dot_product_attention(
        tq_, tk_, tv_, attn_mask=_torch_mask(torch, 2, tq, tk, causal, lengths), enable_gqa=True
    )
    np.testing.assert_allclose(_np(y), ty.detach().numpy(), rtol=1e-12, atol=1e-13)
    g = rng.standard_normal(y.shape)
    (y * _t(g)).sum().backward()
    (ty * torch.tensor(g)).sum().backward()
    for a, b in ((kq, tq_), (kk, tk_), (kv, tv_)):
        np.testing.assert_allclose(_np(a.grad), b.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_gqa_equals_attention_over_repeated_kv(mode: str) -> None:
    """Query head h reads kv head h // (H // Hkv): Hugging Face's repeat_kv, done by hand, gives the same."""
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((1, 6, 3, 4)), rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 5, 4))
    grouped = kael.attention(_t(q), _t(k), _t(v), causal=True)
    rep = kael.attention(_t(q), _t(np.repeat(k, 3, axis=1)), _t(np.repeat(v, 3, axis=1)), causal=True)
    np.testing.assert_allclose(_np(grouped), _np(rep), rtol=1e-13, atol=1e-14)


def test_sdpa_enable_gqa_flag_as_pytorch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    q, k, v = rng.standard_normal((4, 3, 2)), rng.standard_normal((2, 5, 2)), rng.standard_normal((2, 5, 2))
    y = kael.nn.functional.scaled_dot_product_attention(_t(q), _t(k), _t(v), is_causal=False, enable_gqa=True)
    ty = torch.nn.functional.scaled_dot_product_attention(
        torch.tensor(q), torch.tensor(k), torch.tensor(v), enable_gqa=True
    )
    np.testing.assert_allclose(_np(y), ty.numpy(), rtol=1e-12, atol=1e-13)
    with pytest.raises(kael.ShapeError, match="pass enable_gqa=True"):
        kael.nn.functional.scaled_dot_product_attention(_t(q), _t(k), _t(v))


def test_gqa_bad_head_counts_name_both() -> None:
    q, k = kael.randn(1, 6, 2, 4), kael.randn(1, 4, 3, 4)
    with pytest.raises(kael.ShapeError, match=r"the 6 query heads of q \[1, 6, 2, 4\] are not a multiple of the 4"):
        kael.attention(q, k, k)
    with pytest.raises(kael.ShapeError, match="do not fit"):
        kael.attention(q, kael.randn(1, 2, 3, 4), kael.randn(1, 3, 3, 4))
