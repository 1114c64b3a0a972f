"""What the tests/core/test_quantized_*.py files about the model families' quantized weights share: the
schemes and families they run, each family's vocabulary size, ``from_pretrained`` typed loosely, a small
random checkpoint of each family built offline with transformers (``build_checkpoints``), a model's logits
on one sequence (``logits_of``) and seeded random token ids (``random_ids``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kael
import numpy as np
import pytest
from kael.models import from_pretrained as _from_pretrained
from llama_checkpoints import build

__all__ = ["FAMILIES", "SCHEMES", "VOCAB", "build_checkpoints", "from_pretrained", "logits_of", "random_ids"]

SCHEMES = ("q8_0", "q4_0", "bf16", "f16")
FAMILIES = ("gpt2", "llama", "llama-tied", "qwen2")
VOCAB = {"gpt2": 96, "llama": 320, "llama-tied": 320, "qwen2": 320}


def from_pretrained(*args: Any, **kwargs: Any) -> Any:
    """kael.models.from_pretrained, typed loosely (the tests use GPT's and Llama's own attributes)."""
    return _from_pretrained(*args, **kwargs)


def _build_gpt2(directory: Path) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=96, n_positions=64, n_embd=64, n_layer=2, n_head=2, initializer_range=0.2)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(directory)
    return model


def build_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """A small random checkpoint of each family: (directory, the transformers model)."""
    out = {}
    for family in FAMILIES:
        d = tmp_path_factory.mktemp(family)
        if family == "gpt2":
            hf = _build_gpt2(d)
        elif family == "llama-tied":
            hf = build(d, "llama", seed=5, tie_word_embeddings=True)
        else:
            hf = build(d, family, seed=3)
        out[family] = (d, hf)
    return out


def logits_of(model: Any, ids: list[int]) -> np.ndarray:
    """The model's logits on one sequence ``ids``, computed without gradients, as a NumPy copy."""
    with kael.no_grad():
        out: np.ndarray = model(kael.tensor([ids])).numpy()[0].copy()
    return out


def random_ids(family: str, n: int, seed: int = 0) -> list[int]:
    """``n`` token ids drawn uniformly from the family's vocabulary by a generator seeded with ``seed``."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB[family], size=n)]
