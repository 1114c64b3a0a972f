"""Data: IDX (MNIST) files, TensorDataset, DataLoader and DistributedSampler."""

from __future__ import annotations

from .idx import read_idx, read_idx_dataset, read_idx_images, read_idx_labels, write_idx
from .loader import DataLoader, Dataset, TensorDataset
from .sampler import DistributedSampler

__all__ = [
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "TensorDataset",
    "read_idx",
    "read_idx_dataset",
    "read_idx_images",
    "read_idx_labels",
    "write_idx",
]
