"""DecodeBuffers (kael/models/_decode_buffers.py): the direct decode steps' activations, sized once.

Oracle: NumPy slicing of the same memory. A view of the first n rows and each row alone must be
the buffer's rows seen with the declared per-row shape, strides and offset, and nothing is
allocated after construction (the same view objects come back for the same n).
"""

from __future__ import annotations

import kael
import numpy as np
import pytest
from kael.models._decode_buffers import DecodeBuffers, View


def _buffers() -> DecodeBuffers:
    h, d = 2, 3
    w3 = 3 * h * d
    return DecodeBuffers(
        4,
        kael.float32,
        None,
        {"qkv": (1, w3), "rstd": (1,)},
        stats=("rstd",),
        views={"q": View("qkv", (h, 1, d), (d, w3, 1)), "v": View("qkv", (1, h * d), (w3, 1), 2 * h * d)},
    )


def test_buffers_are_allocated_once_for_every_row() -> None:
    buf = _buffers()
    assert buf["qkv"].shape == (4, 1, 18) and buf["qkv"].dtype == kael.float32
    assert buf["rstd"].shape == (4, 1)
    half = DecodeBuffers(2, kael.float64, None, {"x": (1, 4), "rstd": (1,)}, stats=("rstd",))
    assert half["x"].dtype == kael.float64 and half["rstd"].dtype == kael.float64  # statistics follow float64
    assert DecodeBuffers(2, kael.bfloat16, None, {"rstd": (1,)}, stats=("rstd",))["rstd"].dtype == kael.float32


@pytest.mark.parametrize("n", [1, 2, 4])
def test_views_are_the_declared_slices_of_the_first_rows(n: int) -> None:
    buf = _buffers()
    values = np.arange(4 * 18, dtype=np.float32).reshape(4, 1, 18)
    kael.ops._inplace.copy_(buf["qkv"], kael.tensor(values))
    v = buf.views(n)
    assert v is buf.views(n)  # made once per n
    np.testing.assert_array_equal(v["qkv"].numpy(), values[:n])
    want_q = values[:n, 0, :6].reshape(n, 2, 3)[:, :, None, :]  # [n, H, 1, D] from the first H*D values
    np.testing.assert_array_equal(v["q"].numpy(), want_q)
    np.testing.assert_array_equal(v["v"].numpy(), values[:n, :, 12:18])
    rows = buf.rows(n, "q")
    assert rows is buf.rows(n, "q") and len(rows) == n
    for i, r in enumerate(rows):
        assert r.shape == (1, 2, 1, 3)
        np.testing.assert_array_equal(r.numpy()[0], want_q[i])
    assert all(t._storage is buf["qkv"]._storage for t in (v["q"], v["v"], *rows))  # views, never copies
