"""TensorDataset and DataLoader: batching, seeded shuffling, drop_last.

A dataset is anything with `__len__` and `__getitem__(i) -> tuple of tensors`; one
that also has `__getitems__(indices)` (as TensorDataset does) is fetched a whole batch
at a time, by one gather per tensor, instead of sample by sample and stacked.

Shuffling is deterministic: epoch `e` of a loader with seed `s` uses the permutation of
`numpy.random.default_rng((s, e))`, so every epoch has a new order, and two loaders
with the same seed give the same batches. Each `iter()` starts the next epoch.

A `sampler` (anything iterable over indices with a `__len__`, such as `DistributedSampler`)
gives the order instead: each `iter()` batches the indices it yields then.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from kael._errors import ShapeError

__all__ = ["DataLoader", "Dataset", "TensorDataset"]


class Dataset(Protocol):
    """What DataLoader needs of a dataset."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> Any: ...


def _gather(t: Any, indices: np.ndarray[Any, np.dtype[np.int64]]) -> Any:
    """Rows `indices` of `t` (a new tensor, never a view), for kael tensors and NumPy arrays."""
    if isinstance(t, np.ndarray):
        return t[indices]
    from kael._tensor import from_numpy
    from kael.ops import index_select

    return index_select(t, 0, from_numpy(indices))


class TensorDataset:
    """Samples are the rows of the given tensors (or NumPy arrays), which share their first dim."""

    def __init__(self, *tensors: Any) -> None:
        if not tensors:
            raise ShapeError("TensorDataset: expected at least one tensor")
        lengths = [t.shape[0] if len(t.shape) else None for t in tensors]
        if None in lengths or len(set(lengths)) != 1:
            shapes = [tuple(t.shape) for t in tensors]
            raise ShapeError(f"TensorDataset: every tensor needs the same first dimension, got shapes {shapes}")
        self.tensors: tuple[Any, ...] = tensors
        self._len = int(tensors[0].shape[0])

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return tuple(t[index] for t in self.tensors)

    def __getitems__(self, indices: Sequence[int] | np.ndarray[Any, Any]) -> tuple[Any, ...]:
        """A batch: each tensor's rows `indices`, gathered in one op per tensor."""
        idx = np.asarray(indices, dtype=np.int64)
        return tuple(_gather(t, idx) for t in self.tensors)


def _stack(samples: list[Any]) -> tuple[Any, ...]:
    """Collate samples (tuples of tensors or arrays) into a tuple of batched tensors."""
    if not samples:
        return ()
    fields = list(zip(*(s if isinstance(s, tuple) else (s,) for s in samples), strict=True))
    if all(isinstance(x, np.ndarray) for f in fields for x in f):
        return tuple(np.stack(f) for f in fields)
    from kael.ops import stack

    return tuple(stack(list(f)) for f in fields)


class DataLoader:
    """Iterate over a dataset in batches of `batch_size` samples, as tuples of batched tensors.

    `shuffle` draws a new permutation each epoch from `seed` (a random seed when None);
    `drop_last` drops a last batch smaller than `batch_size`; `sampler` (exclusive with `shuffle`)
    yields the indices to batch, in order (for a `DistributedSampler`, call its `set_epoch`).
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int = 1,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int | None = None,
        sampler: Any = None,
    ) -> None:
        if sampler is not None and shuffle:
            raise ShapeError("DataLoader: sampler and shuffle=True are exclusive (the sampler decides the order)")
        if sampler is not None and not (hasattr(sampler, "__iter__") and hasattr(sampler, "__len__")):
            raise ShapeError(f"DataLoader: sampler must be iterable over indices and have a len(), got {sampler!r}")
        if type(batch_size) is not int or batch_size < 1:
            raise ShapeError(f"DataLoader: batch_size must be a positive integer, got {batch_size!r}")
        if seed is not None and (type(seed) is not int or seed < 0):
            raise ShapeError(f"DataLoader: seed must be a non-negative integer or None, got {seed!r}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.sampler = sampler
        # Without a seed, draw one from the OS once: epochs still differ, and `seed` can be logged.
        self.seed: int = seed if seed is not None else int(np.random.SeedSequence().generate_state(2, np.uint64)[0])
        self.epoch = 0

    def __len__(self) -> int:
        n = len(self.dataset) if self.sampler is None else len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _order(self, epoch: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        if self.sampler is not None:
            return np.fromiter(iter(self.sampler), dtype=np.int64, count=len(self.sampler))
        n = len(self.dataset)
        if self.shuffle:
            return np.random.default_rng((self.seed, epoch)).permutation(n).astype(np.int64)
        return np.arange(n, dtype=np.int64)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        order = self._order(self.epoch)
        self.epoch += 1
        return self._batches(order)

    def _batches(self, order: np.ndarray[Any, np.dtype[np.int64]]) -> Iterator[tuple[Any, ...]]:
        batched = getattr(self.dataset, "__getitems__", None)
        for b in range(len(self)):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            if batched is not None:
                yield tuple(batched(idx))
            else:
                yield _stack([self.dataset[int(i)] for i in idx])
