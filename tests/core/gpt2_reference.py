"""The tiny GPT-2 reference checkpoint (tests/data/tiny-gpt2) for the tests/core/test_gpt2*.py files.

``DATA`` is the checkpoint's directory; ``REF``, ``CASES`` and ``TOL`` its reference.json (the
cases by name, each with its token ids, transformers' greedy continuation and, for some, the key
of its logits in reference.safetensors, which ``reference_logits`` loads); ``logits_of`` runs a
model without gradients and ``tiny_gpt`` builds a small, seeded random GPT.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kael
import numpy as np
from kael.models import GPT

__all__ = ["CASES", "DATA", "REF", "TOL", "logits_of", "reference_logits", "tiny_gpt"]

DATA = Path(__file__).resolve().parent.parent / "data" / "tiny-gpt2"
REF: dict[str, Any] = json.loads((DATA / "reference.json").read_text())
CASES: dict[str, dict[str, Any]] = {c["name"]: c for c in REF["cases"]}
TOL: float = REF["tolerance_logits_max_abs"]


def reference_logits() -> dict[str, np.ndarray]:
    """transformers' logits for the cases that have a ``logits_key``, by that key."""
    return {k: v.numpy() for k, v in kael.load_safetensors(DATA / "reference.safetensors").items()}


def logits_of(m: GPT, ids: list[list[int]], **kw: Any) -> np.ndarray:
    """The logits of ``m`` on the batch ``ids``, computed without gradients, as a NumPy copy."""
    with kael.no_grad():
        return m(kael.tensor(ids), **kw).numpy().copy()


def tiny_gpt(vocab: int = 97, ctx: int = 16, layers: int = 2, heads: int = 2, dim: int = 8, seed: int = 0) -> GPT:
    """A small GPT initialised from a generator seeded with ``seed``."""
    return GPT(vocab, ctx, layers, heads, dim, generator=kael.Generator().manual_seed(seed))
