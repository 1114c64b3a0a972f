"""DistributedDataParallel: one model replica per rank, gradients averaged across ranks each step.

NOTE [gradient buckets]: at construction every rank checks that all ranks hold the same
parameters (names, shapes, dtypes, devices: a mismatch raises DistributedError on every rank,
naming the first difference), then takes rank 0's values (broadcast). The parameters that
need a gradient are grouped, in reverse order of ``parameters()`` (roughly the order backward
produces their gradients, as PyTorch does), into buckets of one dtype and device holding about
``bucket_cap_mb`` MB each. A post-accumulate-grad hook on each parameter marks it ready as soon
as backward has written its ``.grad``; a bucket whose parameters are all ready is flattened into
one tensor and its all-reduce (average) started without blocking, so it overlaps with the rest
of the backward. Buckets start strictly in index order, so every rank issues the same
collectives in the same order (MPI requires it) whatever order its hooks fire in. A callback
queued on the engine (``kael.autograd.queue_callback``) runs when the backward ends: it starts
the buckets left (a parameter that got no gradient this step counts as a zero gradient, and its
``.grad`` becomes zeros; so ranks that use different parameters still agree), waits for every
reduction, and makes each ``.grad`` a view of its bucket's averaged values. So when
``backward()`` returns, every rank holds the same averaged gradients, reduced exactly once
(``reduce_calls`` counts the bucket all-reduces).

Inside ``no_sync()`` the hooks do nothing: gradients accumulate locally, and the first backward
after it averages the accumulated ``.grad``. One backward per step outside ``no_sync()``: each
one averages the ``.grad`` it leaves.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from ... import distributed as dist
from ...autograd import no_grad, queue_callback
from ...distributed._collectives import all_gather_bytes
from .._module import Module
from .._parameter import Parameter

__all__ = ["DistributedDataParallel"]


class _Bucket:
    """Parameters (indices into the DDP's list) whose gradients are all-reduced as one flat tensor."""

    __slots__ = ("indices", "nbytes")

    def __init__(self) -> None:
        self.indices: list[int] = []
        self.nbytes = 0


class DistributedDataParallel(Module):
    """Wrap ``module`` for data-parallel training over ``kael.distributed`` (NOTE [gradient buckets]).

    ``forward`` calls the module (after broadcasting its buffers from rank 0 when
    ``broadcast_buffers``); ``backward`` on the loss leaves every parameter's ``.grad`` averaged
    over the ranks. The loss should be a mean over each rank's batch, so that the average over
    ranks is the gradient of the mean over the whole global batch. ``module`` is the wrapped model
    (save checkpoints from it); ``buckets`` lists the parameter names of each bucket;
    ``reduce_calls`` counts bucket all-reduces since construction.
    """

    reduce_calls: int
    _names: list[str]
    _params: list[Parameter]
    _buckets: list[_Bucket]
    _bucket_of: list[int]
    _sync: bool
    _active: bool
    _ready: list[bool]
    _pending: list[int]
    _next: int
    _works: list[tuple[Any, Any]]
    _handles: list[Any]

    def __init__(self, module: Module, bucket_cap_mb: float = 25.0, broadcast_buffers: bool = True) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise dist.DistributedError(
                f"DistributedDataParallel: expected a kael.nn.Module, got {type(module).__name__}"
            )
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb > 0:
            raise dist.DistributedError(
                f"DistributedDataParallel: bucket_cap_mb must be a positive number, got {bucket_cap_mb!r}"
            )
        self.module = module
        self.broadcast_buffers = bool(broadcast_buffers)
        self.bucket_cap_mb = float(bucket_cap_mb)
        named: list[tuple[str, Parameter]] = []
        seen: set[int] = set()
        for name, p in module.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                named.append((name, p))
        _check_same_everywhere(module, named)
        with no_grad():
            for _, p in named:
                dist.broadcast(p, src=0)
            for buf in module.buffers():
                dist.broadcast(buf, src=0)
        trained = [(n, p) for n, p in named if p.requires_grad]
        object.__setattr__(self, "_names", [n for n, _ in trained])
        object.__setattr__(self, "_params", [p for _, p in trained])
        object.__setattr__(self, "_buckets", _make_buckets(self._params, int(self.bucket_cap_mb * 2**20)))
        object.__setattr__(self, "_bucket_of", [0] * len(self._params))
        for b, bucket in enumerate(self._buckets):
            for i in bucket.indices:
                self._bucket_of[i] = b
        object.__setattr__(self, "reduce_calls", 0)
        object.__setattr__(self, "_sync", True)
        object.__setattr__(self, "_active", False)
        object.__setattr__(self, "_ready", [False] * len(self._params))
        object.__setattr__(self, "_pending", [len(b.indices) for b in self._buckets])
        object.__setattr__(self, "_next", 0)
        object.__setattr__(self, "_works", [])
        object.__setattr__(self, "_handles", [])
        if dist.world_size() > 1:
            for i, p in enumerate(self._params):
                self._handles.append(p.register_post_accumulate_grad_hook(self._hook(i)))

    @property
    def buckets(self) -> list[list[str]]:
        """The parameter names of each bucket, in the order they are all-reduced."""
        return [[self._names[i] for i in b.indices] for b in self._buckets]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers and dist.world_size() > 1:
            with no_grad():
                for b in self.module.buffers():
                    dist.broadcast(b, src=0)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Within this block backward accumulates gradients locally without all-reducing them; the first
        backward after it averages the accumulated gradients."""
        prev = self._sync
        object.__setattr__(self, "_sync", False)
        try:
            yield
        finally:
            object.__setattr__(self, "_sync", prev)

    # -- the reduction of one backward (NOTE [gradient buckets]) -----------------------------------
    def _hook(self, i: int) -> Any:
        def ready(p: Any) -> None:
            if not self._sync:
                return
            if not self._active:
                object.__setattr__(self, "_active", True)
                queue_callback(self._end_of_backward)
            if self._ready[i]:
                return
            self._ready[i] = True
            self._pending[self._bucket_of[i]] -= 1
            self._start_ready_buckets()
            for _, work in self._works:
                work.is_completed()  # lets MPI progress the reductions already started

        return ready

    def _start_ready_buckets(self) -> None:
        while self._next < len(self._buckets) and self._pending[self._next] == 0:
            self._start(self._next)
            object.__setattr__(self, "_next", self._next + 1)

    def _start(self, b: int) -> None:
        from ... import ops

        params = [self._params[i] for i in self._buckets[b].indices]
        grads = [p.grad for p in params]
        assert all(g is not None for g in grads)  # a hook saw it, or _end_of_backward set zeros
        flat = ops.cat([g.reshape(-1) for g in grads if g is not None])
        self._works.append((flat, dist.all_reduce(flat, op=dist.ReduceOp.AVG, async_op=True)))
        object.__setattr__(self, "reduce_calls", self.reduce_calls + 1)

    def _end_of_backward(self) -> None:
        from ... import ops

        try:
            for i, p in enumerate(self._params):
                if not self._ready[i]:
                    if p.grad is None:
                        p.grad = ops.zeros_like(p)
                    self._ready[i] = True
                    self._pending[self._bucket_of[i]] -= 1
            self._start_ready_buckets()
            for b, (flat, work) in enumerate(self._works):
                work.wait()
                off = 0
                for i in self._buckets[b].indices:
                    p = self._params[i]
                    n = p.numel()
                    p.grad = flat.narrow(0, off, n).reshape(p.shape)
                    off += n
        finally:
            object.__setattr__(self, "_active", False)
            object.__setattr__(self, "_ready", [False] * len(self._params))
            object.__setattr__(self, "_pending", [len(b.indices) for b in self._buckets])
            object.__setattr__(self, "_next", 0)
            object.__setattr__(self, "_works", [])


def _make_buckets(params: list[Parameter], cap_bytes: int) -> list[_Bucket]:
    """Buckets of about cap_bytes, filled in reverse parameter order, one dtype and device each."""
    buckets: list[_Bucket] = []
    key: tuple[Any, Any] | None = None
    for i in reversed(range(len(params))):
        p = params[i]
        k = (p.dtype, p.device)
        if not buckets or k != key or buckets[-1].nbytes >= cap_bytes:
            buckets.append(_Bucket())
            key = k
        buckets[-1].indices.append(i)
        buckets[-1].nbytes += p.numel() * p.dtype.itemsize
    return buckets


def _describe(entry: list[Any]) -> str:
    name, shape, dtype, device, grad = entry
    return f"{name!r} ({dtype} {shape} on {device}{'' if grad else ', requires_grad=False'})"


def _check_same_everywhere(module: Module, named: list[tuple[str, Parameter]]) -> None:
    """Raise on every rank when the ranks' parameters or buffers differ, naming the first difference."""
    mine: dict[str, Any] = {
        "parameters": [[n, list(p.shape), p.dtype.name, p.device.type, p.requires_grad] for n, p in named],
        "buffers": [[n, list(b.shape), b.dtype.name, b.device.type, True] for n, b in module.named_buffers()],
    }
    everyone = [json.loads(b) for b in all_gather_bytes(json.dumps(mine).encode(), "DistributedDataParallel")]
    ref = everyone[0]
    for r, other in enumerate(everyone[1:], start=1):
        for kind in ("parameters", "buffers"):
            a, b = ref[kind], other[kind]
            for j, (x, y) in enumerate(zip(a, b)):
                if x != y:
                    raise dist.DistributedError(
                        f"DistributedDataParallel: the model differs across ranks: {kind[:-1]} {j} is "
                        f"{_describe(x)} on rank 0 but {_describe(y)} on rank {r}"
                    )
            if len(a) != len(b):
                extra, where = (a[len(b)], 0) if len(a) > len(b) else (b[len(a)], r)
                raise dist.DistributedError(
                    f"DistributedDataParallel: the model differs across ranks: rank 0 has {len(a)} {kind}, "
                    f"rank {r} has {len(b)} (the first one only rank {where} has: {_describe(extra)})"
                )
