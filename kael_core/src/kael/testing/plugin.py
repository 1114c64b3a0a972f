"""The kael pytest plugin: it lives in the top-level module ``kael_pytest`` (see there)."""

from kael_pytest import (
    kael_backend,
    kael_device,
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_report_header,
    pytest_terminal_summary,
    pytest_unconfigure,
    selected_backend,
)

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
