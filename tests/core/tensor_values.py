"""A test helper: exact values in and out of kael tensors, for the autograd and nn tests.

``t`` builds a float64 tensor (optionally requiring grad) and ``val`` reads a tensor back
as nested Python lists, so expected gradients are written as exact literals; ``arr`` reads
a tensor back as a NumPy array, detached from the graph.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np

__all__ = ["arr", "t", "val"]


def t(values: Any, grad: bool = False, dtype: Any = kael.float64) -> kael.Tensor:
    return kael.tensor(values, dtype=dtype, requires_grad=grad)


def val(x: kael.Tensor) -> Any:
    return x.detach().tolist()


def arr(x: kael.Tensor) -> np.ndarray:
    return np.asarray(x.detach().numpy())
