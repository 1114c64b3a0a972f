"""Fixtures shared by all test folders: a seeded NumPy generator and the optional PyTorch oracle."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    """A NumPy generator with a fixed seed, so failures reproduce."""
    return np.random.default_rng(20240501)


@pytest.fixture(scope="session")
def torch() -> Any:
    """PyTorch as an optional oracle: tests that use it are skipped when it is not installed."""
    return pytest.importorskip("torch")
