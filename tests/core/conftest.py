"""Fixtures that several tests/core files share, each file having been split out of one module.

A test file's own fixture of the same name takes precedence (pytest's rule), so these serve only
the files that do not define one: the GPT-2 test files (``model``: the bundled tiny GPT-2,
``ref_logits``: its stored reference logits), the GGUF model files (``root``: a module's scratch
folder, ``gpt2_dir``: a random GPT-2 with GPT-2's real vocabulary in it) and the BPE tokenizer
files (``tok``, ``vocab``: GPT-2's tokenizer and its vocab.json), each module-scoped as it was in
each file; and ``backend``, which runs a test on the CPU device's NumPy reference backend and on
the C++ cpu backend (the model-family parity and decode-step files).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import kael
import numpy as np
import pytest
from bpe_tokenizer_common import DATA as TOKENIZER_DATA
from gguf_models_common import write_random_gpt2
from gpt2_reference import DATA as GPT2_DATA
from gpt2_reference import reference_logits
from kael.models import GPT
from kael.tokenizer import BpeTokenizer


@pytest.fixture(scope="module")
def model() -> GPT:
    """The bundled tiny GPT-2 (tests/data/tiny-gpt2)."""
    return GPT.from_pretrained(GPT2_DATA)


@pytest.fixture(scope="module")
def ref_logits() -> dict[str, np.ndarray]:
    """The tiny GPT-2's stored reference logits, by case."""
    return reference_logits()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch folder for the module's GGUF checkpoints and files."""
    return tmp_path_factory.mktemp("gguf-models")


@pytest.fixture(scope="module")
def gpt2_dir(root: Path) -> Path:
    """A random GPT-2 (2 layers, 64 wide) with GPT-2's real vocabulary (gguf_models_common.write_random_gpt2)."""
    return write_random_gpt2(root / "gpt2")


@pytest.fixture(scope="module")
def tok() -> BpeTokenizer:
    """GPT-2's BPE tokenizer (tests/data/gpt2-tokenizer)."""
    return BpeTokenizer.from_directory(TOKENIZER_DATA)


@pytest.fixture(scope="module")
def vocab() -> dict[str, int]:
    """GPT-2's vocab.json."""
    result: dict[str, int] = json.loads((TOKENIZER_DATA / "vocab.json").read_text(encoding="utf-8"))
    return result


@pytest.fixture(params=["reference", "cpu"])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run on the NumPy reference backend and on the C++ CPU backend."""
    kael.backends.use("cpu", request.param)
    try:
        yield request.param
    finally:
        kael.backends.use("cpu", None)
