"""Fixtures for the kael-backend-cuda tests, which run the backend in host emulation.

No GPU and no CuPy are needed: ``KAEL_CUDA_EMULATE=1`` makes NumPy stand in for CuPy
(NOTE [host emulation] in ``kael_backend_cuda._xp``). The package is used installed
(``pip install --no-deps -e kael_backend_cuda``) or, failing that, from its source
folder; subprocess tests get a throwaway ``.dist-info`` so that kael's entry-point
discovery finds the plugin either way.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "kael_backend_cuda" / "src"

try:
    import kael_backend_cuda  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(SRC))


def _installed() -> bool:
    return any(
        ep.name == "cuda" and ep.value.startswith("kael_backend_cuda")
        for ep in importlib.metadata.entry_points(group="kael.backends")
    )


def _activate() -> Any:
    """Re-probe the backend's state and make sure it is registered; returns the CudaBackend."""
    from kael._plugins import manager

    from kael_backend_cuda import _xp

    _xp.reset()
    manager.ensure_loaded("kael.backends")
    if not any(b.name == "cuda" for b in manager.backends):
        import kael_backend_cuda.plugin as plugin

        manager.register(plugin, "cuda")
    manager.invalidate()
    return next(b for b in manager.backends if b.name == "cuda")


@pytest.fixture
def emulate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The cuda backend under host emulation with one device (restored afterwards)."""
    monkeypatch.setenv("KAEL_CUDA_EMULATE", "1")
    monkeypatch.delenv("KAEL_CUDA_EMULATE_DEVICES", raising=False)
    yield _activate()
    _deactivate()


@pytest.fixture
def emulate2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The cuda backend under host emulation with two devices, cuda:0 and cuda:1."""
    monkeypatch.setenv("KAEL_CUDA_EMULATE", "1")
    monkeypatch.setenv("KAEL_CUDA_EMULATE_DEVICES", "2")
    yield _activate()
    _deactivate()


def _deactivate() -> None:
    from kael._plugins import manager

    from kael_backend_cuda import _xp

    _xp.reset()
    manager.invalidate()


@pytest.fixture
def no_emulation(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The cuda backend with emulation off (so: unavailable on a machine without a GPU)."""
    monkeypatch.delenv("KAEL_CUDA_EMULATE", raising=False)
    monkeypatch.delenv("KAEL_CUDA_EMULATE_DEVICES", raising=False)
    yield _activate()
    _deactivate()


@pytest.fixture(scope="session")
def subprocess_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment for `python ...` subprocesses in which kael discovers the cuda plugin."""
    paths = [str(ROOT / "kael_core" / "src"), str(SRC)]
    if not _installed():
        site = tmp_path_factory.mktemp("site")
        info = site / "kael_backend_cuda-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kael-backend-cuda\nVersion: 0.1.0\n")
        (info / "entry_points.txt").write_text("[kael.backends]\ncuda = kael_backend_cuda.plugin\n")
        paths.insert(0, str(site))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAEL_")}
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env
