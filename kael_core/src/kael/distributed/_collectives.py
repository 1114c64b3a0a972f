"""Collectives on kael tensors: all_reduce, broadcast, all_gather, barrier.

Each one hands MPI a buffer over the tensor's elements and writes the result back in place.

NOTE [collective buffers]: a CPU tensor's buffer is the NumPy view of its elements (no copy)
when it is contiguous, else a contiguous copy that is written back into the strided view
afterwards. A CUDA tensor goes to MPI as an object with ``__cuda_array_interface__`` (its
device pointer) when ``KAEL_DISTRIBUTED_CUDA_AWARE=1`` says the MPI library is CUDA-aware
(MPICH's and Open MPI's wheels are not by default), after a device synchronize; otherwise it
is staged through host memory with the backend's ``to_host``/``from_host``. Moving bytes
(broadcast, all_gather) sends the raw elements as bytes, so every dtype works; reducing
(all_reduce) needs arithmetic MPI knows: float16 and bfloat16 are widened to float32, reduced
there and rounded back (so a sum of many half-precision values is rounded once, at the end),
and bool reduces with logical or (SUM, MAX) and and (MIN).

Every rank must call the same collectives, in the same order, on tensors of the same shape
and dtype; the wait of each one is bounded (NOTE [distributed faults] in ``_group.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _dtype as dt
from .._errors import DTypeError, ShapeError
from .._tensor import Tensor
from ._group import GROUP, DistributedError, wait

__all__ = ["ReduceOp", "Work", "all_gather", "all_gather_bytes", "all_reduce", "barrier", "broadcast"]


class ReduceOp:
    """How all_reduce combines the ranks' values (the strings ``"sum"``, ... work too)."""

    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"


_OPS = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX, ReduceOp.MIN)


class Work:
    """A started collective (``async_op=True``): ``wait()`` completes it and writes the result into
    the tensor; ``is_completed()`` polls it (which also lets MPI progress)."""

    __slots__ = ("_buffers", "_done", "_finish", "_op", "_request")

    def __init__(self, request: Any, op: str, finish: Callable[[], None] | None, buffers: tuple[Any, ...]) -> None:
        self._request = request
        self._op = op
        self._finish = finish
        self._buffers = buffers  # kept alive until MPI is done with them
        self._done = request is None

    def is_completed(self) -> bool:
        """Whether MPI has finished (``wait()`` still writes the result back)."""
        return self._done or bool(self._request.Test())

    def wait(self) -> None:
        """Block until the collective completes (DistributedError after the timeout); idempotent."""
        if not self._done:
            wait(self._request, self._op)
            self._done = True
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()
        self._buffers = ()


def _check_tensor(op: str, t: Any, what: str = "tensor") -> Tensor:
    if not isinstance(t, Tensor):
        raise DTypeError(f"{op}: {what} must be a kael.Tensor, got {type(t).__name__}")
    return t


def _cuda_aware() -> bool:
    return os.environ.get("KAEL_DISTRIBUTED_CUDA_AWARE", "") == "1"


class _CudaBuffer:
    """A contiguous CUDA tensor's elements as an object with ``__cuda_array_interface__`` (v3)."""

    __slots__ = ("__cuda_array_interface__", "_keep")

    def __init__(self, t: Tensor, flat_dtype: np.dtype[Any]) -> None:
        self._keep = t
        n = t.numel() * t.dtype.itemsize // flat_dtype.itemsize
        self.__cuda_array_interface__ = {
            "shape": (n,),
            "typestr": flat_dtype.str,
            "data": (t.data_ptr(), False),
            "strides": None,
            "version": 3,
        }


def _device_buffer(t: Tensor, flat_dtype: np.dtype[Any]) -> Any:
    """A zero-copy buffer over t for MPI, or None when t must be staged through a host copy."""
    if t.device.type == "cpu":
        if not t.is_contiguous():
            return None
        return t._np_view().reshape(-1).view(flat_dtype)
    if _cuda_aware() and t.device.type == "cuda" and t.is_contiguous() and t.numel():
        if hasattr(t.untyped_storage().data, "__cuda_array_interface__"):
            from .. import _dispatch

            _dispatch.backend_for("cuda").synchronize(t.device)  # kernels writing t have finished
            return _CudaBuffer(t, flat_dtype)
    return None


def _host_copy(t: Tensor) -> np.ndarray:
    """A C-contiguous host array of t's elements (dtype ``t.dtype.np``: uint16 bits for bfloat16)."""
    if t.device.type == "cpu":
        return np.array(t._np_view(), order="C")
    from .. import _dispatch

    return np.array(_dispatch.backend_for(t.device.type).to_host(t), order="C")


def _write_back(t: Tensor, host: np.ndarray) -> None:
    """Write host (t's shape, ``t.dtype.np``) into t's elements, whatever its strides and device."""
    if t.device.type == "cpu":
        t._np_view()[...] = host.reshape(t.shape)
    else:
        from .. import _dispatch

        _dispatch.backend_for(t.device.type).from_host(t, np.ascontiguousarray(host.reshape(t.shape)))
    t._bump_version()


def _mpi_op(op: str, dtype: dt.DType) -> Any:
    MPI = GROUP.MPI
    if dtype is dt.bool_:
        return {ReduceOp.SUM: MPI.LOR, ReduceOp.MAX: MPI.LOR, ReduceOp.MIN: MPI.LAND}[op]
    return {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.MAX: MPI.MAX, ReduceOp.MIN: MPI.MIN}[op]


def _check_op(op: Any, dtype: dt.DType) -> str:
    name = op.lower() if isinstance(op, str) else op
    if name not in _OPS:
        raise DistributedError(f"all_reduce: op must be one of {list(_OPS)} (kael.distributed.ReduceOp), got {op!r}")
    if name == ReduceOp.AVG and not dtype.is_floating_point:
        raise DTypeError(f"all_reduce: op 'avg' needs a floating-point tensor, got {dtype!r}; use 'sum'")
    return str(name)


def all_reduce(tensor: Tensor, op: Any = ReduceOp.SUM, async_op: bool = False) -> Any:
    """Combine ``tensor`` across all ranks with ``op`` (SUM, AVG, MAX, MIN) and write the result into
    it on every rank. Returns the tensor, or with ``async_op=True`` a ``Work`` to ``wait()`` on."""
    t = _check_tensor("all_reduce", tensor)
    name = _check_op(op, t.dtype)
    if GROUP.size == 1 or t.numel() == 0:
        return Work(None, "all_reduce", None, ()) if async_op else t
    MPI = GROUP.MPI
    widen = t.dtype in (dt.float16, dt.bfloat16)
    size = GROUP.size
    buf = None if widen else _device_buffer(t, np.dtype(t.dtype.np))
    finish: Callable[[], None] | None
    if buf is not None:

        def finish() -> None:
            t._bump_version()
            if name == ReduceOp.AVG:
                if isinstance(buf, np.ndarray):
                    np.divide(buf, size, out=buf)
                else:
                    from ..autograd import no_grad

                    with no_grad():
                        t.div_(size)

    else:
        host = _host_copy(t).reshape(-1)
        if t.dtype is dt.bfloat16:
            buf = dt.bf16_bits_to_f32(host).copy()
        elif t.dtype is dt.float16:
            buf = host.astype(np.float32)
        else:
            buf = host
        staged = buf

        def finish() -> None:
            out = staged
            if name == ReduceOp.AVG:
                out = out / out.dtype.type(size)
            if t.dtype is dt.bfloat16:
                out = dt.f32_to_bf16_bits(out)
            elif t.dtype is dt.float16:
                out = out.astype(np.float16)
            _write_back(t, out)

    request = GROUP.comm.Iallreduce(MPI.IN_PLACE, buf, op=_mpi_op(name, t.dtype))
    work = Work(request, "all_reduce", finish, (buf, t))
    if async_op:
        return work
    work.wait()
    return t


def broadcast(tensor: Tensor, src: int = 0, async_op: bool = False) -> Any:
    """Copy rank ``src``'s ``tensor`` into ``tensor`` on every other rank (same shape and dtype
    everywhere). Returns the tensor, or with ``async_op=True`` a ``Work``."""
    t = _check_tensor("broadcast", tensor)
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < GROUP.size:
        raise DistributedError(f"broadcast: src must be a rank in 0..{GROUP.size - 1}, got {src!r}")
    if GROUP.size == 1 or t.numel() == 0:
        return Work(None, "broadcast", None, ()) if async_op else t
    u8 = np.dtype(np.uint8)
    buf = _device_buffer(t, u8)
    finish: Callable[[], None] | None
    if buf is not None:
        finish = t._bump_version
    else:
        host = _host_copy(t)
        buf = host.reshape(-1).view(u8)

        def finish() -> None:
            _write_back(t, host)

    work = Work(GROUP.comm.Ibcast(buf, root=src), "broadcast", finish, (buf, t))
    if async_op:
        return work
    work.wait()
    return t


def all_gather(tensor_list: Sequence[Tensor], tensor: Tensor, async_op: bool = False) -> Any:
    """Fill ``tensor_list[r]`` with rank r's ``tensor``, on every rank (PyTorch's signature): the
    list holds ``world_size()`` tensors of ``tensor``'s shape and dtype. Returns None, or a ``Work``."""
    t = _check_tensor("all_gather", tensor)
    if not isinstance(tensor_list, (list, tuple)) or len(tensor_list) != GROUP.size:
        got = len(tensor_list) if isinstance(tensor_list, (list, tuple)) else type(tensor_list).__name__
        raise ShapeError(f"all_gather: tensor_list must be a list of world_size()={GROUP.size} tensors, got {got}")
    for i, out in enumerate(tensor_list):
        _check_tensor("all_gather", out, f"tensor_list[{i}]")
        if out.shape != t.shape or out.dtype is not t.dtype:
            raise ShapeError(
                f"all_gather: tensor_list[{i}] is {out.dtype!r} of shape {list(out.shape)}, expected "
                f"{t.dtype!r} of shape {list(t.shape)} (the input's)"
            )
    if GROUP.size == 1:
        _write_back(tensor_list[0], _host_copy(t))
        return Work(None, "all_gather", None, ()) if async_op else None
    send = _host_copy(t).reshape(-1).view(np.uint8)
    recv = np.empty((GROUP.size, send.size), np.uint8)

    def finish() -> None:
        for r, out in enumerate(tensor_list):
            _write_back(out, recv[r].view(t.dtype.np).reshape(t.shape))

    work = Work(GROUP.comm.Iallgather(send, recv), "all_gather", finish, (send, recv))
    if async_op:
        return work
    work.wait()
    return None


def barrier() -> None:
    """Wait until every rank has reached this call (bounded by the timeout)."""
    if GROUP.size > 1:
        wait(GROUP.comm.Ibarrier(), "barrier")


def all_gather_bytes(data: bytes, op: str) -> list[bytes]:
    """Every rank's ``data`` (of any length), in rank order; for checks across ranks."""
    if GROUP.size == 1:
        return [data]
    n = np.array([len(data)], np.int64)
    counts = np.empty(GROUP.size, np.int64)
    wait(GROUP.comm.Iallgather(n, counts), op)
    send = np.frombuffer(data, np.uint8) if data else np.empty(0, np.uint8)
    recv = np.empty(int(counts.sum()), np.uint8)
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    wait(GROUP.comm.Iallgatherv(send, [recv, (counts.tolist(), displs.tolist()), GROUP.MPI.BYTE]), op)
    return [recv[d : d + c].tobytes() for d, c in zip(displs.tolist(), counts.tolist())]
