"""Views never copy: shapes and strides like PyTorch, shared storage, writes through views; indexing both ways."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kael
import numpy as np
import pytest
from kael.testing import assert_close

A = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def _same_storage(v: kael.Tensor, base: kael.Tensor) -> bool:
    return v._storage is base._storage


VIEWS: dict[str, tuple[Callable[[Any], Any], Callable[[np.ndarray], np.ndarray]]] = {
    "view": (lambda t: t.view(6, 4), lambda a: a.reshape(6, 4)),
    "view_infer": (lambda t: t.view(-1, 2), lambda a: a.reshape(-1, 2)),
    "reshape_contig": (lambda t: t.reshape(4, 6), lambda a: a.reshape(4, 6)),
    "permute": (lambda t: t.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1)),
    "transpose": (lambda t: t.transpose(0, 2), lambda a: a.swapaxes(0, 2)),
    "T": (lambda t: t.T, lambda a: a.transpose(2, 1, 0)),
    "mT": (lambda t: t.mT, lambda a: a.swapaxes(-1, -2)),
    "slice_step": (lambda t: t.slice(2, 1, 4, 2), lambda a: a[:, :, 1:4:2]),
    "narrow": (lambda t: t.narrow(1, 1, 2), lambda a: a[:, 1:3]),
    "select": (lambda t: t.select(1, -1), lambda a: a[:, -1]),
    "expand": (lambda t: t[:, :1].expand(3, 2, 5, 4), lambda a: np.broadcast_to(a[:, :1], (3, 2, 5, 4))),
    "expand_minus1": (lambda t: t[:1].expand(3, -1, -1, -1), lambda a: np.broadcast_to(a[:1], (3, 1, 3, 4))),
    "unsqueeze": (lambda t: t.unsqueeze(-1), lambda a: a[..., None]),
    "squeeze": (lambda t: t[:, :1].squeeze(), lambda a: a[:, :1].squeeze()),
    "squeeze_dim": (lambda t: t[:1].squeeze(0), lambda a: a[0]),
    "flatten": (lambda t: t.flatten(1), lambda a: a.reshape(2, 12)),
    "getitem_basic": (lambda t: t[1, ::2, None, -3:], lambda a: a[1, ::2, None, -3:]),
    "getitem_ellipsis": (lambda t: t[..., 1], lambda a: a[..., 1]),
    "getitem_none_ellipsis": (lambda t: t[None, ..., None, 2:], lambda a: a[None, ..., None, 2:]),
    "getitem_empty_slice": (lambda t: t[:, 5:], lambda a: a[:, 5:]),
    "view_of_transposed": (lambda t: t.transpose(1, 2).view(2, 4, 3), lambda a: a.swapaxes(1, 2)),
    "chain": (
        lambda t: t.T[1:, ::2].permute(2, 0, 1)[0],
        lambda a: a.transpose(2, 1, 0)[1:, ::2].transpose(2, 0, 1)[0],
    ),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_views_share_storage_and_match_numpy(name: str) -> None:
    fn, np_fn = VIEWS[name]
    t = kael.tensor(A)
    v = fn(t)
    want = np_fn(A)
    assert _same_storage(v, t), f"{name} copied"
    assert v.shape == want.shape
    assert v.tolist() == want.tolist()
    assert tuple(s * 4 for s in v.stride()) == want.strides or want.size == 0 or 0 in want.strides


@pytest.mark.filterwarnings("ignore:The use of `x.T`")
@pytest.mark.parametrize("name", sorted(VIEWS))
def test_strides_match_torch(name: str, torch: Any) -> None:
    if name == "slice_step":
        pytest.skip("Tensor.slice is kael's own method")
    fn, _ = VIEWS[name]
    v = fn(kael.tensor(A))
    tv = fn(torch.tensor(A))
    assert v.shape == tuple(tv.shape)
    if v.numel():
        assert v.stride() == tv.stride() and v.storage_offset() == tv.storage_offset()


def test_writes_through_views_reach_the_base() -> None:
    t = kael.tensor(A).clone()
    t.T[1, 2].fill_(-1)
    t[0, :, ::3] = 100.0
    t.select(2, 3)[1].mul_(0)
    want = A.copy()
    want.transpose(2, 1, 0)[1, 2] = -1
    want[0, :, ::3] = 100
    want[..., 3][1] = 0
    assert_close(t, want)


def test_reshape_copies_only_when_it_must() -> None:
    t = kael.tensor(A)
    assert _same_storage(t.reshape(24), t)
    tt = t.transpose(1, 2)
    r = tt.reshape(24)
    assert not _same_storage(r, t) and r.tolist() == A.swapaxes(1, 2).reshape(24).tolist()
    with pytest.raises(kael.ShapeError, match="reshape"):
        tt.view(24)
    with pytest.raises(kael.ShapeError):
        t.view(5, -1)
    with pytest.raises(kael.ShapeError):
        t.view(-1, -1)
    e = kael.zeros(0, 3)
    assert e.reshape(3, 0).shape == (3, 0) and e.view(-1).shape == (0,)


def test_expand_has_zero_strides() -> None:
    e = kael.tensor([[1.0], [2.0]]).expand(2, 3)
    assert e.stride() == (1, 0) and e.tolist() == [[1.0] * 3, [2.0] * 3]
    with pytest.raises(kael.ShapeError):
        kael.ones(2, 3).expand(3, 3)


def test_split_and_chunk_are_views() -> None:
    t = kael.arange(10)
    parts = t.split(4)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(_same_storage(p, t) for p in parts)
    assert [p.tolist() for p in t.split([1, 9])] == [[0], list(range(1, 10))]
    assert [p.shape for p in t.chunk(3)] == [(4,), (4,), (2,)]
    with pytest.raises(kael.ShapeError):
        t.split([3, 3])


# -- advanced indexing ---------------------------------------------------------------------------

ADVANCED: dict[str, Callable[[Any], Any]] = {
    "int_list": lambda i: [1, 0, 1],
    "int_tensor_2d": lambda i: i([[1, 0], [0, 1]]),
    "negative": lambda i: i([-1, 0]),
    "bool_mask_row": lambda i: i([True, False]),
    "bool_mask_2d": lambda i: i([[True, False, True], [False, False, True]]),
    "second_dim": lambda i: (slice(None), i([2, 0])),
    "ellipsis_last": lambda i: (Ellipsis, i([3, 1, 1])),
    "two_tensors": lambda i: (i([0, 1, 1]), i([2, 0, 1])),
    "two_tensors_bcast": lambda i: (i([[0], [1]]), slice(None), i([3, 0])),
    "tensor_and_int": lambda i: (i([1, 0]), 2),
    "empty_index": lambda i: i(np.zeros(0, np.int64)),
    "all_false_mask": lambda i: i([False, False]),
}


@pytest.mark.parametrize("name", sorted(ADVANCED))
def test_advanced_getitem_matches_numpy(name: str) -> None:
    kkey = ADVANCED[name](lambda v: kael.tensor(v))
    nkey = ADVANCED[name](lambda v: np.array(v))
    got = kael.tensor(A)[kkey]
    want = A[nkey]
    assert got.shape == want.shape and got.tolist() == want.tolist()


@pytest.mark.parametrize("name", sorted(ADVANCED))
def test_advanced_getitem_matches_torch(name: str, torch: Any) -> None:
    kkey = ADVANCED[name](lambda v: kael.tensor(v))
    tkey = ADVANCED[name](lambda v: torch.tensor(np.array(v)))
    got = kael.tensor(A)[kkey]
    want = torch.tensor(A)[tkey]
    assert got.shape == tuple(want.shape) and got.tolist() == want.tolist()


def test_advanced_getitem_copies() -> None:
    t = kael.tensor(A)
    r = t[kael.tensor([0])]
    r.fill_(-5)
    assert t.tolist() == A.tolist()


SETITEM: dict[str, tuple[Any, Any]] = {
    "int": ((1, 2, 3), 7.0),
    "slice_scalar": ((slice(None), slice(1, None, 2)), -1.0),
    "slice_tensor_bcast": ((0, slice(None)), np.array([1.0, 2.0, 3.0, 4.0], np.float32)),
    "ellipsis": ((Ellipsis, 0), 9.0),
    "bool_mask": ("mask", 0.0),
    "int_tensor": ("rows", 5.0),
    "int_tensor_values": ("rows", np.arange(24, dtype=np.float32).reshape(2, 3, 4)[:2] * -1),
}


@pytest.mark.parametrize("name", sorted(SETITEM))
def test_setitem_matches_numpy(name: str) -> None:
    key, value = SETITEM[name]
    t = kael.tensor(A).clone()
    want = A.copy()
    if key == "mask":
        t[t > 10] = value
        want[want > 10] = value
    elif key == "rows":
        t[kael.tensor([1, 0])] = kael.tensor(value) if isinstance(value, np.ndarray) else value
        want[[1, 0]] = value
    else:
        t[key] = kael.tensor(value) if isinstance(value, np.ndarray) else value
        want[key] = value
    assert_close(t, want)


def test_setitem_with_integer_tensor_key_on_column(torch: Any) -> None:
    t = kael.tensor(A).clone()
    tt = torch.tensor(A).clone()
    t[:, kael.tensor([2, 0])] = 0.5
    tt[:, torch.tensor([2, 0])] = 0.5
    assert t.tolist() == tt.tolist()


SETITEM_TORCH: dict[str, tuple[Callable[[Any], Any], Any]] = {
    "two_tensors": (lambda i: (i([0, 1, 1]), i([2, 0, 2])), [[1.0], [2.0], [3.0]]),
    "mask_with_values": (lambda i: i(A > 15), [float(v) for v in range(8)]),
    "column_tensor_bcast": (lambda i: (slice(None), slice(None), i([0, 2])), [[-1.0, -2.0]]),
    "ellipsis_tensor": (lambda i: (Ellipsis, i([3])), 4.0),
    "negative_index": (lambda i: i([-1]), 0.0),
    "row_mask": (lambda i: i([False, True]), [9.0]),
}


@pytest.mark.parametrize("name", sorted(SETITEM_TORCH))
def test_setitem_matches_torch(name: str, torch: Any) -> None:
    keyf, value = SETITEM_TORCH[name]
    t, tt = kael.tensor(A).clone(), torch.tensor(A).clone()
    v0 = t._version()
    t[keyf(lambda v: kael.tensor(v))] = kael.tensor(value) if isinstance(value, list) else value
    tt[keyf(lambda v: torch.tensor(np.array(v)))] = torch.tensor(value) if isinstance(value, list) else value
    assert t.tolist() == tt.tolist()
    assert t._version() > v0


def test_setitem_repeated_index_last_write_wins() -> None:
    t = kael.zeros(3)
    t[kael.tensor([1, 1, 2])] = kael.tensor([5.0, 6.0, 7.0])
    assert t.tolist() == [0.0, 6.0, 7.0]


def test_setitem_into_noncontiguous_view_and_gradients() -> None:
    base = kael.zeros(3, 4)
    base.T[kael.tensor([1, 3])] = 1.0
    assert base.tolist() == [[0.0, 1.0, 0.0, 1.0]] * 3
    w = kael.tensor([2.0, 3.0], requires_grad=True)
    x = kael.ones(4, requires_grad=True)
    y = x * 1.0
    y[kael.tensor([0, 2])] = w * w
    y.sum().backward()
    assert w.grad is not None and w.grad.tolist() == [4.0, 6.0]
    assert x.grad is not None and x.grad.tolist() == [0.0, 1.0, 0.0, 1.0]


def test_setitem_errors() -> None:
    t = kael.zeros(2, 3)
    with pytest.raises(kael.ShapeError):
        t[kael.tensor([0, 1])] = kael.ones(3, 3)
    with pytest.raises(kael.IndexError_):
        t[kael.tensor([2])] = 1.0
    with pytest.raises(kael.DTypeError):
        t[kael.tensor([0])] = "x"
