"""kael.distributed in one process (no mpiexec): a world of one where collectives are identities,
clear errors for bad arguments and a missing mpi4py, DistributedSampler against PyTorch's, the
DataLoader's sampler, DDP's buckets, and the autograd hooks DDP is built on."""

from __future__ import annotations

import math
import sys
from typing import Any

import kael
import kael.distributed as dist
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kael import nn
from kael.data import DataLoader, DistributedSampler, TensorDataset
from kael.nn.parallel import DistributedDataParallel


def test_a_world_of_one_before_init() -> None:
    assert (dist.rank(), dist.world_size(), dist.get_rank(), dist.get_world_size()) == (0, 1, 0, 1)
    assert not dist.is_initialized()


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min", dist.ReduceOp.AVG])
def test_collectives_are_identities_in_a_world_of_one(op: str) -> None:
    values = np.array([[1.5, -2.0], [3.0, 0.25]])
    t = kael.tensor(values)
    assert dist.all_reduce(t, op=op) is t
    np.testing.assert_array_equal(t.numpy(), values)
    work = dist.all_reduce(t, op=op, async_op=True)
    assert work.is_completed()
    work.wait()
    assert dist.broadcast(t, src=0) is t
    out = [kael.zeros(2, 2, dtype=kael.float64)]
    dist.all_gather(out, t.T)
    np.testing.assert_array_equal(out[0].numpy(), values.T)
    dist.barrier()
    np.testing.assert_array_equal(t.numpy(), values)


def test_bad_arguments_are_clear_errors() -> None:
    t = kael.tensor([1, 2, 3])
    with pytest.raises(kael.DTypeError, match=r"all_reduce: op 'avg' needs a floating-point tensor, got .*int64"):
        dist.all_reduce(t, op="avg")
    with pytest.raises(dist.DistributedError, match=r"all_reduce: op must be one of .*got 'product'"):
        dist.all_reduce(t, op="product")
    with pytest.raises(kael.DTypeError, match=r"all_reduce: tensor must be a kael.Tensor, got ndarray"):
        dist.all_reduce(np.zeros(3))  # type: ignore[arg-type]
    with pytest.raises(dist.DistributedError, match=r"broadcast: src must be a rank in 0..0, got 1"):
        dist.broadcast(t, src=1)
    with pytest.raises(kael.ShapeError, match=r"all_gather: tensor_list must be a list of world_size\(\)=1 tensors"):
        dist.all_gather([t, t], t)
    with pytest.raises(kael.ShapeError, match=r"all_gather: tensor_list\[0\] is .*float32 of shape \[3\], expected"):
        dist.all_gather([kael.zeros(3)], t)
    assert issubclass(dist.DistributedError, kael.KaelError)


def test_init_without_mpi4py_names_the_packages_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now raises ImportError
    with pytest.raises(dist.DistributedError, match=r"init: kael.distributed needs mpi4py .*pip install mpi4py mpich"):
        dist.init()
    assert not dist.is_initialized() and dist.world_size() == 1


@pytest.mark.parametrize("timeout", [0, -1.0, "10", True, math.nan])
def test_init_rejects_a_bad_timeout(timeout: Any) -> None:
    with pytest.raises(dist.DistributedError, match=r"init: timeout must be a positive number of seconds, got "):
        dist.init(timeout=timeout)


@pytest.mark.parametrize("raw", ["soon", "0", "-3"])
def test_init_rejects_a_bad_timeout_variable(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("KAEL_DISTRIBUTED_TIMEOUT", raw)
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(dist.DistributedError, match=rf"KAEL_DISTRIBUTED_TIMEOUT must be a positive .*got '{raw}'"):
        dist.init()


# --- DistributedSampler -------------------------------------------------------------------------------


def pytorch_rule(n: int, replicas: int, rank: int, drop_last: bool, order: list[int]) -> list[int]:
    """PyTorch's DistributedSampler, written out: pad by repeating (or cut), then every replicas-th."""
    if drop_last:
        total = (n // replicas) * replicas
        order = order[:total]
    else:
        total = -(-n // replicas) * replicas
        pad = total - n
        if pad and order:
            order = order + (order * math.ceil(pad / len(order)))[:pad]
    return order[rank:total:replicas]


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 40),
    replicas=st.integers(1, 7),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 5),
)
def test_sampler_shares_follow_pytorchs_rule(
    n: int, replicas: int, drop_last: bool, shuffle: bool, seed: int, epoch: int
) -> None:
    samplers = [
        DistributedSampler(n, replicas, r, shuffle=shuffle, seed=seed, drop_last=drop_last) for r in range(replicas)
    ]
    for s in samplers:
        s.set_epoch(epoch)
    order = np.random.default_rng(seed + epoch).permutation(n).tolist() if shuffle else list(range(n))
    shares = [list(s) for s in samplers]
    for r, share in enumerate(shares):
        assert share == pytorch_rule(n, replicas, r, drop_last, order)
        assert len(share) == len(samplers[r])
    assert len({len(s) for s in shares}) == 1  # every rank gets as many batches
    if n and not drop_last:
        assert set().union(*shares) == set(range(n))  # together they cover the dataset
    if n >= replicas:  # no padding needed beyond one repeat round: the shares are disjoint until the pad
        flat = [i for s in shares for i in s]
        assert len(set(flat)) == (n if not drop_last else len(flat))


@pytest.mark.parametrize(("n", "replicas", "drop_last"), [(10, 3, False), (10, 3, True), (2, 5, False), (12, 4, False)])
def test_sampler_without_shuffle_matches_torch(torch: Any, n: int, replicas: int, drop_last: bool) -> None:
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    for r in range(replicas):
        theirs = list(TorchSampler(range(n), num_replicas=replicas, rank=r, shuffle=False, drop_last=drop_last))
        assert list(DistributedSampler(range(n), replicas, r, shuffle=False, drop_last=drop_last)) == theirs


def test_sampler_epochs_reorder_the_same_way_on_every_rank() -> None:
    a, b = DistributedSampler(20, 2, 0, seed=3), DistributedSampler(20, 2, 1, seed=3)
    first = list(a) + list(b)
    a.set_epoch(1)
    b.set_epoch(1)
    second = list(a) + list(b)
    assert sorted(first) == sorted(second) == list(range(20)) and first != second


def test_sampler_defaults_to_this_process_in_the_world() -> None:
    s = DistributedSampler(5, shuffle=False)
    assert (s.num_replicas, s.rank, list(s)) == (1, 0, [0, 1, 2, 3, 4])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_replicas": 0}, r"num_replicas must be a positive integer, got 0"),
        ({"num_replicas": 2, "rank": 2}, r"rank must be in 0..1, got 2"),
        ({"num_replicas": 2, "rank": -1}, r"rank must be in 0..1, got -1"),
        ({"seed": -5}, r"seed must be a non-negative integer, got -5"),
    ],
)
def test_sampler_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(dist.DistributedError, match="DistributedSampler: " + message):
        DistributedSampler(10, **kwargs)
    with pytest.raises(dist.DistributedError, match=r"set_epoch: epoch must be a non-negative integer, got -1"):
        DistributedSampler(10).set_epoch(-1)


def test_dataloader_batches_the_samplers_indices() -> None:
    data = np.arange(11) * 10
    ds = TensorDataset(kael.tensor(data))
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=7)
    loader = DataLoader(ds, batch_size=4, sampler=sampler)
    want = data[sampler.indices()]
    got = np.concatenate([b[0].numpy() for b in loader])
    np.testing.assert_array_equal(got, want)
    assert len(loader) == 2 == math.ceil(len(sampler) / 4)
    with pytest.raises(kael.ShapeError, match=r"DataLoader: sampler and shuffle=True are exclusive"):
        DataLoader(ds, batch_size=2, shuffle=True, sampler=sampler)
    with pytest.raises(kael.ShapeError, match=r"DataLoader: sampler must be iterable over indices and have a len"):
        DataLoader(ds, batch_size=2, sampler=object())


# --- DistributedDataParallel in a world of one --------------------------------------------------------


def mlp(seed: int = 0) -> nn.Module:
    kael.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)).double()


def grads_of(model: nn.Module, x: kael.Tensor, y: kael.Tensor) -> dict[str, np.ndarray]:
    model.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    return {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


def test_ddp_in_a_world_of_one_leaves_gradients_as_the_module_computes_them(rng: np.random.Generator) -> None:
    x, y = kael.tensor(rng.standard_normal((5, 4))), kael.tensor(rng.standard_normal((5, 2)))
    plain, wrapped = mlp(), mlp()
    ddp = DistributedDataParallel(wrapped)
    want, got = grads_of(plain, x, y), grads_of(ddp, x, y)
    for name in want:
        np.testing.assert_array_equal(got["module." + name], want[name])
    assert ddp.reduce_calls == 0 and ddp.module is wrapped
    with ddp.no_sync():
        np.testing.assert_array_equal(ddp(x).numpy(force=True), plain(x).numpy(force=True))


def test_ddp_buckets_hold_about_the_cap_in_reverse_order_one_dtype_each() -> None:
    model = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 2))  # float32: 96 + 24 + 48 + 8 bytes
    model[1].double()
    assert DistributedDataParallel(model).buckets == [["1.bias", "1.weight"], ["0.bias", "0.weight"]]
    model = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 2))
    # a bucket closes once it holds the cap: 8 + 48 bytes >= 50, then 24 + 96
    assert DistributedDataParallel(model, bucket_cap_mb=50 / 2**20).buckets == [
        ["1.bias", "1.weight"],
        ["0.bias", "0.weight"],
    ]
    assert DistributedDataParallel(model, bucket_cap_mb=1).buckets == [["1.bias", "1.weight", "0.bias", "0.weight"]]
    model[0].weight.requires_grad_(False)  # frozen: not reduced
    assert DistributedDataParallel(model).buckets == [["1.bias", "1.weight", "0.bias"]]


@pytest.mark.parametrize("cap", [0, -1, "25", True])
def test_ddp_bad_arguments(cap: Any) -> None:
    with pytest.raises(dist.DistributedError, match=r"bucket_cap_mb must be a positive number, got "):
        DistributedDataParallel(mlp(), bucket_cap_mb=cap)
    with pytest.raises(dist.DistributedError, match=r"expected a kael.nn.Module, got function"):
        DistributedDataParallel(mlp)  # type: ignore[arg-type]


# --- the autograd hooks DDP uses ----------------------------------------------------------------------


def test_post_accumulate_grad_hook_sees_the_accumulated_gradient() -> None:
    w = kael.tensor([1.0, 2.0, 3.0], requires_grad=True)
    seen: list[list[float]] = []
    handle = w.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.tolist()))
    w.register_hook(lambda g: g * 10)  # runs first: the hook sees the modified, accumulated .grad
    (w * w).sum().backward()  # grad 2w * 10
    (w * 1.0).sum().backward()  # accumulates 1 * 10
    assert seen == [[20.0, 40.0, 60.0], [30.0, 50.0, 70.0]]
    handle.remove()
    (w * 1.0).sum().backward()
    assert len(seen) == 2 and w.grad.tolist() == [40.0, 60.0, 80.0]


def test_post_accumulate_grad_hook_needs_a_leaf_that_requires_grad() -> None:
    w = kael.tensor([1.0], requires_grad=True)
    with pytest.raises(kael.AutogradError, match=r"register_post_accumulate_grad_hook: only a leaf tensor"):
        (w * 2).register_post_accumulate_grad_hook(print)
    with pytest.raises(kael.AutogradError, match=r"only a leaf tensor .*requires_grad=False"):
        kael.tensor([1.0]).register_post_accumulate_grad_hook(print)
    with pytest.raises(kael.AutogradError, match=r"expected a callable, got 3"):
        w.register_post_accumulate_grad_hook(3)


def test_queue_callback_runs_once_after_the_last_node() -> None:
    a = kael.tensor([1.0, 2.0], requires_grad=True)
    b = kael.tensor([3.0], requires_grad=True)
    log: list[Any] = []

    def at_end() -> None:
        log.append(("end", a.grad.tolist(), b.grad.tolist(), kael.is_grad_enabled()))
        kael.autograd.queue_callback(lambda: log.append("chained"))

    def first(t: kael.Tensor) -> None:
        if not log:
            kael.autograd.queue_callback(at_end)
        log.append("hook")

    a.register_post_accumulate_grad_hook(first)
    b.register_post_accumulate_grad_hook(first)
    ((a * b).sum() + b.sum()).backward()
    assert log == ["hook", "hook", ("end", [3.0, 3.0], [4.0], False), "chained"]
    with pytest.raises(kael.AutogradError, match=r"queue_callback: no backward is running"):
        kael.autograd.queue_callback(print)
