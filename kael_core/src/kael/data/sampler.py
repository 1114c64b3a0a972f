"""DistributedSampler: the share of a dataset's indices that one rank of a data-parallel job reads.

PyTorch's semantics: epoch ``e`` shuffles all indices with ``seed + e`` (the same permutation on
every rank), then, unless ``drop_last``, repeats indices from the start until the count divides
evenly by ``num_replicas`` (with ``drop_last``, the tail is dropped instead); rank r takes every
``num_replicas``-th index starting at r. So each rank sees ``len(sampler)`` samples, the ranks'
shares are disjoint apart from the padding, and together they cover the dataset. Call
``set_epoch(e)`` before each epoch for a new order. The permutation is NumPy's
``default_rng(seed + epoch)``, not PyTorch's generator, so the orders differ from PyTorch's.

Give it to ``DataLoader(dataset, batch_size, sampler=...)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from kael.distributed import DistributedError

__all__ = ["DistributedSampler"]


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


class DistributedSampler:
    """Indices of ``dataset`` (or of ``range(dataset)`` when given a length) for rank ``rank`` of
    ``num_replicas`` (defaults: ``kael.distributed.rank()`` and ``world_size()``)."""

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        from kael import distributed as dist

        n = int(dataset) if _is_int(dataset) else len(dataset)
        if n < 0:
            raise DistributedError(f"DistributedSampler: the dataset length must be non-negative, got {n}")
        if num_replicas is None:
            num_replicas = dist.world_size()
        if rank is None:
            rank = dist.rank()
        if not _is_int(num_replicas) or num_replicas < 1:
            raise DistributedError(f"DistributedSampler: num_replicas must be a positive integer, got {num_replicas!r}")
        if not _is_int(rank) or not 0 <= rank < num_replicas:
            raise DistributedError(f"DistributedSampler: rank must be in 0..{num_replicas - 1}, got {rank!r}")
        if not _is_int(seed) or seed < 0:
            raise DistributedError(f"DistributedSampler: seed must be a non-negative integer, got {seed!r}")
        self.dataset_len = n
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        if self.drop_last:
            self.num_samples = n // self.num_replicas
        else:
            self.num_samples = -(-n // self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s permutation from now on (the same on every rank)."""
        if not _is_int(epoch) or epoch < 0:
            raise DistributedError(f"DistributedSampler.set_epoch: epoch must be a non-negative integer, got {epoch!r}")
        self.epoch = int(epoch)

    def indices(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """This rank's indices for the current epoch, as an int64 array."""
        n = self.dataset_len
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(n).astype(np.int64)
        else:
            order = np.arange(n, dtype=np.int64)
        if self.total_size > n:  # pad by repeating from the start (more than once when n is tiny)
            order = np.resize(order, self.total_size) if n else order
        else:
            order = order[: self.total_size]
        return order[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples
