"""Plugins seen from outside the test process: the conformance kit and ``python -m kael info``.

The conformance kit (``pytest --pyargs kael.testing.conformance``) and ``python -m kael
info`` run in subprocesses, from a directory outside the repository, with plugin dists
installed on the fly (plugin_dists.py): a primitives-only third-party backend and the
reference backend pass the kit, a broken backend's failures name the op, dtype, sample and
diff, the kit is inert without its option; ``kael info`` reports plugins, backends and
devices; ``import kael`` loads no plugin; kael.testing's plugin re-exports kael_pytest.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import kael
import pytest
from plugin_dists import PRIMITIVES_ONLY, RAISES, install

KAEL_SRC = str(Path(kael.__file__).resolve().parent.parent)

BROKEN_ADD = """
    import numpy as np

    import kael
    from kael.backends import host, memory
    from kael.backends.reference import ReferenceBackend


    def add(out, a, b):  # a classic bug: reads b as if it were contiguous from its offset
        n = out.numel()
        flat = memory.buffer(b).view(b.dtype.np)[b.storage_offset():b.storage_offset() + n]
        host.write(out, host.read(a) + (flat.reshape(out.shape) if flat.size == n else host.read(b)))


    class BrokenAdd(ReferenceBackend):
        name = "broken-add"
        priority = 5

        def __init__(self):
            super().__init__()
            self.kernels["add"] = add


    @kael.hookimpl
    def kael_backends():
        return [BrokenAdd()]
"""


# -- subprocesses: the conformance kit and python -m kael info -----------------------------------------


def _env(site: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAEL_") and k != "PYTEST_ADDOPTS"}
    paths = ([str(site)] if site else []) + [KAEL_SRC] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


def _kit(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    plugin = [] if metadata.entry_points(group="pytest11", name="kael_testing") else ["-p", "kael_pytest"]
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "kael.testing.conformance",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        *plugin,
        *args,
    ]
    return subprocess.run(cmd, cwd=cwd, env=_env(site), capture_output=True, text=True, timeout=900)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A working directory outside the repository (the kit must run from anywhere)."""
    d = tmp_path / "elsewhere"
    d.mkdir()
    return d


def test_primitives_only_third_party_backend_passes_the_kit(tmp_path: Path, outside: Path) -> None:
    site = install(tmp_path / "site", "kaeltest_primonly", {"kael.backends": {"primonly": PRIMITIVES_ONLY}})
    r = _kit(site, outside, "--kael-backend", "primonly", "-rs")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "kael backend: 'primonly' for device type 'cpu'" in out
    assert " passed" in out and "failed" not in r.stdout.strip().splitlines()[-1]  # pytest's summary line
    assert "has no fused 'softmax' kernel" in out  # its fused ops ran through the decompositions


def test_reference_backend_passes_the_kit(tmp_path: Path, outside: Path) -> None:
    r = _kit(tmp_path, outside, "--kael-backend", "reference")
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    assert "kael backend: 'reference'" in r.stdout


def test_kit_failures_name_op_dtype_sample_and_diff(tmp_path: Path, outside: Path) -> None:
    site = install(tmp_path / "site", "kaeltest_brokenadd", {"kael.backends": {"broken-add": BROKEN_ADD}})
    r = _kit(site, outside, "--kael-backend", "broken-add", "-k", "test_primitive and add-float32")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-4000:]
    assert "op 'add', dtype float32, sample 'strided', output 0 (float32):" in out
    assert "max abs diff" in out and "worst at index" in out
    assert "test_primitive[add-float32-1d] PASSED" not in out  # -q: only failures are listed
    assert "passed" in r.stdout.strip().splitlines()[-1]  # the contiguous samples still pass (pytest's summary)


def test_kit_is_inert_without_the_option(tmp_path: Path, outside: Path) -> None:
    r = _kit(tmp_path, outside, "-k", "test_declarations or add-float32-1d")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "skipped" in r.stdout and "passed" not in r.stdout
    bad = _kit(tmp_path, outside, "--kael-backend", "nosuch", "-k", "test_declarations")
    assert bad.returncode != 0 and "no such kael backend is installed" in bad.stderr
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "kael.testing.conformance",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:kael_testing",
        "-k",
        "test_declarations or gpt2",
    ]
    r = subprocess.run(cmd, cwd=outside, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "2 skipped" in r.stdout, (r.stdout + r.stderr)[-3000:]  # without the plugin too


def test_python_m_kael_info(tmp_path: Path, outside: Path) -> None:
    site = install(
        tmp_path / "site", "kaeltest_info", {"kael.backends": {"primonly": PRIMITIVES_ONLY, "broken": RAISES}}
    )
    r = subprocess.run(
        [sys.executable, "-m", "kael", "info"],
        cwd=outside,
        env=_env(site, KAEL_BLOCK_PLUGINS="cuda,cpu"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"kael {kael.__version__}") and "Python" in out and "NumPy" in out
    for section in ("plugins:", "backends:", "devices:"):
        assert section in out
    assert "primonly" in out and "loaded [kaeltest_info 0.1]" in out
    assert "broken" in out and "failed" in out and "boom while importing the plugin" in out
    assert "reference" in out and "priority=0" in out and "priority=5" in out
    assert "cpu    served by 'primonly'" in out
    assert "plugin 'broken'" in r.stderr and "failed to load and was skipped" in r.stderr
    strict = subprocess.run(
        [sys.executable, "-m", "kael", "info"],
        cwd=outside,
        env=_env(site, KAEL_STRICT_PLUGINS="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert strict.returncode != 0 and "RuntimeError: boom while importing the plugin" in strict.stderr
    off = subprocess.run(
        [sys.executable, "-m", "kael", "info"],
        cwd=outside,
        env=_env(site, KAEL_DISABLE_PLUGIN_AUTOLOAD="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert off.returncode == 0 and "primonly" not in off.stdout and "cpu    served by 'reference'" in off.stdout


def test_import_kael_loads_no_plugin(tmp_path: Path) -> None:
    site = install(tmp_path / "site", "kaeltest_lazy", {"kael.backends": {"broken": RAISES}})
    code = "import sys, kael; print(sorted(m for m in sys.modules if m.startswith('kaeltest_lazy')))"
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(site, KAEL_STRICT_PLUGINS="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


def test_kael_testing_plugin_reexports_kael_pytest() -> None:
    import kael_pytest
    from kael.testing import plugin

    assert plugin.__all__ == kael_pytest.__all__ and "pytest_addoption" in plugin.__all__
    assert all(getattr(plugin, name) is getattr(kael_pytest, name) for name in kael_pytest.__all__)
