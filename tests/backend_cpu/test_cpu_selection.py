"""Installing the package selects it for device cpu; KAEL_BACKEND_CPU=reference switches back.

Checked in subprocesses so the environment variables apply from the start. Skipped when
the package is importable but not installed (no ``kael.backends`` entry point).
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata

import pytest

pytest.importorskip("kael_backend_cpu")

_installed = any(
    ep.name == "cpu" and ep.value.startswith("kael_backend_cpu") for ep in metadata.entry_points(group="kael.backends")
)
pytestmark = pytest.mark.skipif(not _installed, reason="kael-backend-cpu is importable but not installed")

_PROBE = "import kael; b = kael.backends.current('cpu'); print(b.name, type(b).__module__)"


def _selected(**env: str) -> str:
    full = {k: v for k, v in os.environ.items() if k not in ("KAEL_BACKEND_CPU", "KAEL_DISABLE_PLUGIN_AUTOLOAD")}
    full.update(env)
    res = subprocess.run([sys.executable, "-c", _PROBE], env=full, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_installed_package_serves_cpu() -> None:
    assert _selected() == "cpu kael_backend_cpu._backend"


def test_environment_switches_back_to_the_reference() -> None:
    assert _selected(KAEL_BACKEND_CPU="reference").startswith("reference ")


def test_use_switches_at_run_time() -> None:
    import kael

    prev = kael.backends.current("cpu").name
    try:
        kael.backends.use("cpu", "reference")
        assert kael.backends.current("cpu").name == "reference"
        x = kael.tensor([1.0, 2.0]) * 3
        assert x.tolist() == [3.0, 6.0]
        kael.backends.use("cpu", "cpu")
        assert kael.backends.current("cpu").name == "cpu"
        assert (kael.tensor([1.0, 2.0]) * 3).tolist() == [3.0, 6.0]
    finally:
        kael.backends.use("cpu", prev)


def test_plugin_info() -> None:
    from kael_backend_cpu import plugin

    info = plugin.kael_plugin_info()
    assert info["name"] == "kael-backend-cpu" and info["version"]
