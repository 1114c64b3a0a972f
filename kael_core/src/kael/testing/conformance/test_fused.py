"""Fused ops: the backend's kernel (when it has one) and the frontend decomposition, both against the reference."""

from __future__ import annotations

from typing import Any

import pytest

from kael.backends import catalogue
from kael.testing.conformance import Case, check_decomposition, check_kernel, fused_op_cases

DECOMPOSITIONS = catalogue.decompositions()


@pytest.mark.parametrize("case", fused_op_cases(), ids=lambda c: c.id)
def test_fused_kernel(case: Case, kael_backend: Any, kael_device: Any) -> None:
    if case.op not in kael_backend.supported_ops():
        pytest.skip(f"backend {kael_backend.name!r} has no fused {case.op!r} kernel (the frontend decomposes it)")
    check_kernel(case, kael_backend, kael_device)


@pytest.mark.parametrize("case", [c for c in fused_op_cases() if c.op in DECOMPOSITIONS], ids=lambda c: c.id)
def test_decomposition(case: Case, kael_backend: Any, kael_device: Any) -> None:
    check_decomposition(case, DECOMPOSITIONS[case.op], kael_device, kael_backend)
