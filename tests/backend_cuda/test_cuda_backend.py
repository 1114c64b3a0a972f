"""The cuda backend under host emulation: devices, host<->device copies, strided views, memory, kael.cuda."""

from __future__ import annotations

import kael
import numpy as np
import pytest

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def _values(name: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(len(name))
    if name == "bool":
        return rng.random(shape) < 0.5
    if name.startswith(("int", "uint")):
        return rng.integers(0, 100, size=shape)
    return rng.standard_normal(shape)


def test_backend_is_selected_for_cuda(emulate):
    b = kael.backends.current("cuda")
    assert b is emulate and b.name == "cuda" and b.device_type == "cuda"
    assert b.is_available() == (True, "")
    assert b.emulated
    assert b.supported_ops() >= kael._ops.PRIMITIVES | kael._ops.FUSED  # every op, the mixture-of-experts pair too


def test_tensor_on_cuda_reports_its_device(emulate):
    t = kael.tensor([[1.0, 2.0], [3.0, 4.0]], device="cuda")
    assert t.device.type == "cuda" and t.is_cuda
    assert t.__dlpack_device__() == (2, 0)
    assert "device='cuda:0'" in repr(t)  # like PyTorch: a tensor lives on a concrete device
    assert (t * 2).device is t.device


@pytest.mark.parametrize("name", DTYPES)
def test_round_trip_every_dtype(emulate, name):
    d = getattr(kael, name if name != "bool" else "bool")
    host = kael.tensor(_values(name, (3, 4)), dtype=d)
    dev = host.to("cuda")
    assert dev.device.type == "cuda" and dev.dtype is d and dev.shape == (3, 4)
    back = dev.cpu()
    assert back.device.type == "cpu"
    np.testing.assert_array_equal(
        back.float().numpy() if name == "bfloat16" else back.numpy(),
        host.float().numpy() if name == "bfloat16" else host.numpy(),
    )
    assert dev.tolist() == host.tolist()


def test_copies_are_independent_of_the_host(emulate):
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = kael.tensor(arr, device="cuda")
    arr[0, 0] = 100.0  # the device copy must not see this
    assert t.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    host = t.numpy(force=True)
    host[1, 1] = -1.0  # nor this: numpy(force=True) of a cuda tensor is a copy
    assert t[1, 1].item() == 4.0
    c = t.cpu()
    c.add_(1.0)
    assert t[0, 1].item() == 1.0


def test_numpy_without_force_refuses_device_tensors(emulate):
    t = kael.ones(2, device="cuda")
    with pytest.raises(kael.DeviceError, match="cpu"):
        t.numpy()


def test_item_tolist_and_scalars(emulate):
    t = kael.arange(10, device="cuda").float()
    assert t.sum().item() == 45.0
    assert float(t.max()) == 9.0
    assert t[3:6].tolist() == [3.0, 4.0, 5.0]
    assert bool((t > 8).any())


def test_strided_views_match_the_cpu(emulate):
    base = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    c = kael.tensor(base)
    g = c.to("cuda")
    views = [
        lambda t: t.transpose(0, 2),
        lambda t: t[:, ::2, 1::2],
        lambda t: t.permute(2, 0, 1)[1:],
        lambda t: t[1].T,
        lambda t: t[:, :1, :].expand(2, 4, 5),
        lambda t: t.select(2, 3),
    ]
    for f in views:
        vc, vg = f(c), f(g)
        assert vg._storage is g._storage  # a view, no copy
        assert vg.stride() == vc.stride() and vg.storage_offset() == vc.storage_offset()
        np.testing.assert_array_equal(vg.cpu().numpy(), vc.numpy())
        np.testing.assert_array_equal((vg * 3 + 1).cpu().numpy(), (vc * 3 + 1).numpy())
        np.testing.assert_array_equal(vg.contiguous().cpu().numpy(), vc.numpy())


def test_in_place_on_overlapping_views(emulate):
    base = np.arange(8, dtype=np.float32)
    c = kael.tensor(base)
    g = c.to("cuda")
    for t in (c, g):
        t[1:].add_(t[:-1])  # reads and writes overlap
        t[::2] = t[1::2].clone()
    np.testing.assert_array_equal(g.cpu().numpy(), c.numpy())


def test_bfloat16_arithmetic_matches_cpu(emulate):
    x = kael.tensor(_values("float32", (4, 5)), dtype=kael.bfloat16)
    y = x.to("cuda")
    np.testing.assert_array_equal(((y * 3 - 1) / 7).float().cpu().numpy(), ((x * 3 - 1) / 7).float().numpy())
    np.testing.assert_array_equal(y.sum(1).float().cpu().numpy(), x.sum(1).float().numpy())


def test_two_emulated_devices(emulate2):
    assert kael.cuda.device_count() == 2
    a = kael.ones(3, device="cuda:1")
    assert a.device.index == 1 and a.__dlpack_device__() == (2, 1)
    assert (a + 1).tolist() == [2.0, 2.0, 2.0]
    b = a.to("cuda:0")
    assert b.device.index == 0 and b.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(kael.DeviceError, match="same device"):
        _ = a + b
    with pytest.raises(kael.DeviceError, match="no such CUDA device"):
        kael.zeros(2, device="cuda:2")


def test_memory_stats_follow_allocations(emulate):
    import gc

    gc.collect()  # tensors of earlier tests still waiting for the collector would free memory mid-test
    before = kael.cuda.memory_stats()["allocated_bytes"]
    t = kael.empty(1 << 20, dtype=kael.uint8, device="cuda")
    during = kael.cuda.memory_stats()
    assert during["allocated_bytes"] - before == 1 << 20
    assert during["peak_allocated_bytes"] >= during["allocated_bytes"]
    del t
    gc.collect()
    assert kael.cuda.memory_stats()["allocated_bytes"] == before


def test_kael_cuda_module(emulate):
    assert kael.cuda.is_available()
    assert kael.cuda.unavailable_reason() == ""
    assert kael.cuda.device_count() == 1
    assert kael.cuda.backend() is emulate
    kael.cuda.synchronize()
    kael.cuda.synchronize("cuda:0")
    kael.cuda.synchronize(0)
    with pytest.raises(kael.DeviceError, match="expected a cuda device"):
        kael.cuda.synchronize("cpu")


def test_random_tensors_match_the_cpu_for_a_seed(emulate):
    g1 = kael.Generator().manual_seed(7)
    g2 = kael.Generator().manual_seed(7)
    a = kael.randn(3, 4, generator=g1)
    b = kael.randn(3, 4, generator=g2, device="cuda")
    np.testing.assert_array_equal(b.cpu().numpy(), a.numpy())


def test_model_to_cuda_and_back(emulate):
    lin = kael.nn.Linear(4, 3)
    x = kael.randn(2, 4)
    want = lin(x).detach().numpy()
    lin.to("cuda")
    assert lin.weight.device.type == "cuda"
    got = lin(x.to("cuda")).detach().cpu().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
