"""The kael pytest plugin (entry point ``pytest11: kael_testing``): inert unless asked.

A top-level module, not part of the ``kael`` package, so that pytest loading it at
start-up does not import kael: ``pytest --cov=kael`` then measures kael's module-level
code too (pytest-cov starts measuring after the entry-point plugins are imported).
``kael.testing.plugin`` re-exports it.

It adds ``--kael-backend NAME``. Given the option, it selects that backend for its
device type for the whole session (``kael.backends.use``), prints it in the report
header, and provides the ``kael_backend`` and ``kael_device`` fixtures; the
conformance kit (``pytest --pyargs kael.testing.conformance --kael-backend NAME``)
runs, with ``KAEL_QUANT_ACTIVATIONS=f32`` unless the environment sets it: the
float32-activation path of quantized linears is the conformance reference (a backend
that may quantize activations as llama.cpp does, as the C++ CPU backend does by default
for few rows, reads that variable). Without it, nothing happens: kael is not imported, no fixture is active, and
tests of the conformance kit are skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = [
    "pytest_addoption",
    "pytest_configure",
    "pytest_unconfigure",
    "pytest_report_header",
    "pytest_terminal_summary",
    "pytest_collection_modifyitems",
    "kael_backend",
    "kael_device",
    "selected_backend",
]

_KIT = "kael.testing.conformance"
_state: dict[str, Any] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kael", "kael backend conformance")
    group.addoption(
        "--kael-backend",
        metavar="NAME",
        default=None,
        help="run kael tests (--pyargs kael.testing.conformance) against the kael backend NAME",
    )


def _find(name: str) -> Any:
    import kael

    found = [b for b in kael.backends.available() if b.name == name]
    if not found:
        names = sorted(b.name for b in kael.backends.available())
        raise pytest.UsageError(f"--kael-backend {name!r}: no such kael backend is installed; installed: {names}")
    return found[0]


def pytest_configure(config: pytest.Config) -> None:
    name = config.getoption("kael_backend", default=None)
    if not name:
        return
    import kael

    backend = _find(name)
    ok, reason = backend.is_available()
    if not ok:
        raise pytest.UsageError(f"--kael-backend {name!r}: the backend is not available here: {reason}")
    if not os.environ.get("KAEL_QUANT_ACTIVATIONS"):
        os.environ["KAEL_QUANT_ACTIVATIONS"] = "f32"
        _state["activations_set"] = True
    _state["previous"] = (backend.device_type, kael.backends.override(backend.device_type))
    kael.backends.use(backend.device_type, name)
    _state["backend"] = backend


def pytest_unconfigure(config: pytest.Config) -> None:
    prev = _state.pop("previous", None)
    _state.pop("backend", None)
    if _state.pop("activations_set", False):
        os.environ.pop("KAEL_QUANT_ACTIVATIONS", None)
    if prev is not None:
        import kael

        kael.backends.use(prev[0], prev[1])


def selected_backend() -> Any:
    """The Backend chosen with --kael-backend, or None."""
    return _state.get("backend")


def pytest_report_header(config: pytest.Config) -> str | None:
    b = selected_backend()
    if b is None:
        return None
    return (
        f"kael backend: {b.name!r} for device type {b.device_type!r} (priority {b.priority}, "
        f"api {b.api_version}, {type(b).__module__}.{type(b).__qualname__})"
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    line = pytest_report_header(terminalreporter.config)
    if line is not None:  # also under -q, where the header is not shown
        terminalreporter.write_line(line)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if selected_backend() is not None:
        return
    skip = pytest.mark.skip(reason="kael conformance kit: pass --kael-backend NAME to run it")
    for item in items:
        mod = getattr(getattr(item, "module", None), "__name__", "")
        if mod.startswith(_KIT):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def kael_backend() -> Any:
    """The kael Backend selected with --kael-backend (the test is skipped without the option)."""
    b = selected_backend()
    if b is None:
        pytest.skip("pass --kael-backend NAME to run tests against a kael backend")
    return b


@pytest.fixture(scope="session")
def kael_device(kael_backend: Any) -> Iterator[Any]:
    """The kael.device the selected backend serves: 'cpu', or '<type>:0'."""
    import kael

    yield kael.device(
        kael_backend.device_type if kael_backend.device_type == "cpu" else f"{kael_backend.device_type}:0"
    )
