"""kael.testing: test helpers for kael users and backend authors.

* ``assert_close(actual, expected, rtol=, atol=)``: dtype-aware closeness with a
  precise failure message (worst element, max abs diff).
* ``gradcheck(fn, inputs)``: autograd Jacobians against central finite differences.
* ``conformance``: the backend conformance kit, a pytest suite run with
  ``python -m pytest --pyargs kael.testing.conformance --kael-backend NAME``.
* ``plugin``: the pytest plugin (entry point ``pytest11``) behind ``--kael-backend``.
"""

from __future__ import annotations

from typing import Any

from ._assert import assert_close
from ._blocks import weight_blocks
from ._gradcheck import gradcheck

__all__ = ["assert_close", "gradcheck", "weight_blocks", "conformance"]


def __getattr__(name: str) -> Any:
    if name == "conformance":  # imported on use: it builds the case table
        import importlib

        return importlib.import_module("kael.testing.conformance")
    raise AttributeError(f"module 'kael.testing' has no attribute {name!r}")
