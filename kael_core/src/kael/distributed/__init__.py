"""kael.distributed: data-parallel training over MPI.

Start the ranks with ``mpiexec -n N python train.py``; in the script, ``init()`` joins
the job. ``rank()``/``world_size()`` (also ``get_rank``/``get_world_size``) say where
this process stands; ``all_reduce`` (SUM, AVG, MAX, MIN), ``broadcast``, ``all_gather``
and ``barrier`` work in place on kael tensors of any dtype and strides, on CPU through
NumPy buffers and on CUDA through ``__cuda_array_interface__`` (NOTE [collective
buffers]). Every collective's wait is bounded by a timeout, and an uncaught exception on
one rank aborts the job (NOTE [distributed faults]); both raise or end with
``DistributedError``. Without ``init()`` (or without ``mpiexec``) the world is one
process and the collectives are identities, so single-process code runs unchanged.
``kael.nn.parallel.DistributedDataParallel`` and ``kael.data.DistributedSampler`` build
on these. MPI comes from PyPI: ``pip install mpi4py mpich``; importing this module does
not need it.
"""

from __future__ import annotations

from ._collectives import ReduceOp, Work, all_gather, all_reduce, barrier, broadcast
from ._group import DistributedError, abort, get_rank, get_world_size, init, is_initialized, rank, world_size

__all__ = [
    "DistributedError",
    "ReduceOp",
    "Work",
    "abort",
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "get_rank",
    "get_world_size",
    "init",
    "is_initialized",
    "rank",
    "world_size",
]
