"""kael.nn: modules, layers, containers, and the functional, init, parallel and utils helpers."""

from __future__ import annotations

from . import functional, init, parallel, utils
from ._containers import ModuleDict, ModuleList, Sequential
from ._layers import GELU, Dropout, Embedding, Flatten, Identity, LayerNorm, Linear, ReLU, RMSNorm, SiLU
from ._module import IncompatibleKeys, Module
from ._parameter import Parameter

__all__ = [
    "Module",
    "Parameter",
    "IncompatibleKeys",
    "Linear",
    "Embedding",
    "LayerNorm",
    "RMSNorm",
    "Dropout",
    "GELU",
    "ReLU",
    "SiLU",
    "Identity",
    "Flatten",
    "Sequential",
    "ModuleList",
    "ModuleDict",
    "functional",
    "init",
    "parallel",
    "utils",
]
