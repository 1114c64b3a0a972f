"""kael.nn.parallel: data-parallel training (``DistributedDataParallel``) over ``kael.distributed``."""

from __future__ import annotations

from ._distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
