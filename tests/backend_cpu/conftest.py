"""Fixtures for the native CPU backend tests: the backend under test and the reference oracle.

Kernels are called directly on both backends (never through the dispatcher), so these
tests compare kael_backend_cpu with the NumPy reference whichever backend is selected.
Each test module skips itself when kael_backend_cpu is not installed.
"""

from __future__ import annotations

from typing import Any

import pytest
from kael.backends.reference import ReferenceBackend


@pytest.fixture(scope="session")
def cpu() -> Any:
    kbc = pytest.importorskip("kael_backend_cpu")
    return kbc.CpuBackend()


@pytest.fixture(scope="session")
def ref() -> ReferenceBackend:
    return ReferenceBackend()
