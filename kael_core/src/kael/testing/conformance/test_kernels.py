"""Every primitive kernel of the backend against the reference kernel, row by row of the table."""

from __future__ import annotations

from typing import Any

import pytest

from kael.testing.conformance import Case, check_kernel, primitive_cases


@pytest.mark.parametrize("case", primitive_cases(), ids=lambda c: c.id)
def test_primitive(case: Case, kael_backend: Any, kael_device: Any) -> None:
    check_kernel(case, kael_backend, kael_device)
