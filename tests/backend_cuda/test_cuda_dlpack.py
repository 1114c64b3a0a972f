"""DLPack on the cuda backend under emulation: export, import, zero-copy, device ids, refusals.

Under emulation a cuda tensor's memory is host memory, so the capsules are NumPy's; the
protocol plumbing (``Tensor.__dlpack__`` -> ``backend.dlpack``, ``kael.from_dlpack`` ->
``backend.from_dlpack`` for device type 2) is the same as on a GPU, where CuPy and
PyTorch CUDA tensors go through it zero-copy (checked by scripts/validate.py).
"""

from __future__ import annotations

import kael
import numpy as np
import pytest


def test_round_trip_shares_memory(emulate):
    t = kael.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], device="cuda")
    u = kael.from_dlpack(t)
    assert u.device.type == "cuda" and u.shape == (2, 3) and u.dtype is kael.float32
    assert u.tolist() == t.tolist()
    u.mul_(10.0)  # zero-copy: t sees the write
    assert t.tolist() == [[10.0, 20.0, 30.0], [40.0, 50.0, 60.0]]


@pytest.mark.parametrize("name", ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float64"])
def test_round_trip_dtypes(emulate, name):
    d = getattr(kael, name)
    t = kael.arange(6, device="cuda").to(d)
    u = kael.from_dlpack(t)
    assert u.dtype is d and u.tolist() == t.tolist()


def test_strided_views_keep_their_strides(emulate):
    base = kael.arange(24, device="cuda").float().reshape(2, 3, 4)
    v = base.transpose(0, 2)[1:, :, ::2]
    u = kael.from_dlpack(v)
    assert u.shape == v.shape and u.stride() == v.stride()
    np.testing.assert_array_equal(u.cpu().numpy(), v.cpu().numpy())
    u.fill_(-1.0)  # v is base[0, :, 1:] seen as [k, j, i]
    assert (base[0, :, 1:] == -1.0).all().item()
    assert base[0, :, 0].tolist() == [0.0, 4.0, 8.0] and base[1].min().item() == 12.0


def test_second_device_index_survives(emulate2):
    t = kael.ones(3, device="cuda:1")
    assert t.__dlpack_device__() == (2, 1)
    u = kael.from_dlpack(t)
    assert u.device.index == 1


def test_bfloat16_export_is_refused(emulate):
    t = kael.ones(2, dtype=kael.bfloat16, device="cuda")
    with pytest.raises(kael.DTypeError, match="bfloat16"):
        t.__dlpack__()


def test_requires_grad_export_is_refused(emulate):
    t = kael.ones(2, device="cuda", requires_grad=True)
    with pytest.raises(kael.AutogradError):
        t.__dlpack__()


def test_cpu_producers_still_import_on_cpu(emulate):
    u = kael.from_dlpack(np.arange(4.0))
    assert u.device.type == "cpu" and u.tolist() == [0.0, 1.0, 2.0, 3.0]
