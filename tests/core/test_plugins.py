"""The plugin mechanism: third-party backends through entry points, failure isolation, selection and overrides.

Plugins are installed on the fly: a temporary directory on the path holds a package
and a ``.dist-info`` whose ``entry_points.txt`` registers it, exactly what ``pip
install`` would leave. In-process tests use a fresh ``PluginManager`` (the global one
is left alone); the conformance kit and ``python -m kael info`` run in subprocesses,
from a directory outside the repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import kael
import pytest
from kael import _dispatch
from kael._plugins import PluginManager, manager
from kael.backends.reference import ReferenceBackend

KAEL_SRC = str(Path(kael.__file__).resolve().parent.parent)

PRIMITIVES_ONLY = """
    import kael
    from kael.backends.reference import ReferenceBackend


    class PrimitivesOnly(ReferenceBackend):
        '''The reference kernels without a single fused op: every fused op runs its decomposition.'''

        name = "primonly"
        priority = 5

        def __init__(self):
            super().__init__(fused=False)


    @kael.hookimpl
    def kael_backends():
        return [PrimitivesOnly()]
"""

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

RAISES = """
    raise RuntimeError("boom while importing the plugin")
"""


def _backend_module(name: str, device_type: str, priority: int, api: str = "1.0") -> str:
    return f"""
    import kael
    from kael.backends.reference import ReferenceBackend


    class B(ReferenceBackend):
        name = {name!r}
        device_type = {device_type!r}
        priority = {priority}
        api_version = {api!r}


    @kael.hookimpl
    def kael_backends():
        return [B()]
"""


def install(root: Path, dist: str, plugins: dict[str, dict[str, str]]) -> Path:
    """Write package `dist` (one module per plugin) and its dist-info under root; return root.

    plugins: {entry-point group: {plugin name: module source}}.
    """
    pkg = root / dist
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    lines = []
    for group, entries in plugins.items():
        lines.append(f"[{group}]")
        for name, source in entries.items():
            mod = name.replace("-", "_")
            (pkg / f"{mod}.py").write_text(textwrap.dedent(source))
            lines.append(f"{name} = {dist}.{mod}")
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path for plugin dists; entry points are limited to the ones installed there."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    real = metadata.entry_points
    prefix = f"kaeltest_{abs(hash(str(tmp_path))) % 10**8}"

    def ours(**kwargs: Any) -> list[metadata.EntryPoint]:
        found: Any = real(**kwargs)
        return [ep for ep in found if ep.dist is not None and ep.dist.name.startswith(prefix)]

    monkeypatch.setattr(metadata, "entry_points", ours)
    for var in (
        "KAEL_STRICT_PLUGINS",
        "KAEL_DISABLE_PLUGIN_AUTOLOAD",
        "KAEL_BLOCK_PLUGINS",
        "KAEL_BACKEND_CPU",
        "KAEL_BACKEND_TESTDEV",
    ):
        monkeypatch.delenv(var, raising=False)
    root.joinpath(".prefix").write_text(prefix)
    yield root
    for mod in [m for m in sys.modules if m.startswith(prefix)]:
        del sys.modules[mod]


def _dist(site: Path, suffix: str = "") -> str:
    return site.joinpath(".prefix").read_text() + suffix


# -- in process: a fresh PluginManager per test --------------------------------------------------------


def test_entry_point_backend_is_discovered_lazily(site: Path) -> None:
    d = _dist(site)
    install(site, d, {"kael.backends": {"primonly": PRIMITIVES_ONLY}})
    pm = PluginManager()
    assert not [m for m in sys.modules if m.startswith(d)], "the plugin was imported before first use"
    chosen = pm.select("cpu")
    assert chosen.name == "primonly" and chosen.priority == 5  # beats the reference backend (priority 0)
    rec = pm.records["kael.backends:primonly"]
    assert rec.status == "loaded" and rec.dist == d and rec.backends == ["primonly"]
    assert "softmax" not in chosen.supported_ops() and "add" in chosen.supported_ops()


def test_failing_plugin_is_reported_by_name_and_skipped(site: Path) -> None:
    install(site, _dist(site), {"kael.backends": {"broken": RAISES, "primonly": PRIMITIVES_ONLY}})
    pm = PluginManager()
    with pytest.warns(RuntimeWarning, match=r"plugin 'broken' .* failed to load and was skipped: RuntimeError: boom"):
        chosen = pm.select("cpu")
    assert chosen.name == "primonly", "a broken plugin must not keep the others from loading"
    assert pm.records["kael.backends:broken"].status == "failed"
    assert "boom while importing" in pm.records["kael.backends:broken"].error


def test_strict_plugins_reraises_the_original_error(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(site, _dist(site), {"kael.backends": {"broken": RAISES}})
    monkeypatch.setenv("KAEL_STRICT_PLUGINS", "1")
    with pytest.raises(RuntimeError, match="boom while importing the plugin") as info:
        PluginManager().select("cpu")
    assert any("broken.py" in str(entry.path) for entry in info.traceback), "the original traceback was lost"


def test_equal_priorities_conflict_naming_both(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(
        site,
        _dist(site),
        {
            "kael.backends": {
                "alpha": _backend_module("alpha", "testdev", 3),
                "beta": _backend_module("beta", "testdev", 3),
            }
        },
    )
    pm = PluginManager()
    with pytest.raises(kael.BackendError, match=r"'alpha' and 'beta' both serve 'testdev' at priority 3"):
        pm.select("testdev")
    monkeypatch.setenv("KAEL_BACKEND_TESTDEV", "beta")
    assert pm.select("testdev").name == "beta"
    monkeypatch.delenv("KAEL_BACKEND_TESTDEV")
    pm.use("testdev", "alpha")
    assert pm.select("testdev").name == "alpha"
    with pytest.raises(kael.BackendError, match="gamma"):
        pm.use("testdev", "gamma")
    pm.use("testdev", None)
    with pytest.raises(kael.BackendError, match="both serve"):
        pm.select("testdev")


def test_backend_env_override_and_use(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(site, _dist(site), {"kael.backends": {"primonly": PRIMITIVES_ONLY}})
    pm = PluginManager()
    assert pm.select("cpu").name == "primonly"
    monkeypatch.setenv("KAEL_BACKEND_CPU", "reference")
    pm.invalidate()
    assert pm.select("cpu").name == "reference"
    monkeypatch.setenv("KAEL_BACKEND_CPU", "nosuch")
    pm.invalidate()
    with pytest.raises(kael.BackendError, match=r"'nosuch' requested for 'cpu' is not installed.*primonly"):
        pm.select("cpu")
    monkeypatch.delenv("KAEL_BACKEND_CPU")
    pm.use("cpu", "reference")  # kael.backends.use beats priority ...
    assert pm.select("cpu").name == "reference"
    monkeypatch.setenv("KAEL_BACKEND_CPU", "primonly")
    assert pm.select("cpu").name == "reference"  # ... and the environment
    pm.use("cpu", None)
    assert pm.select("cpu").name == "primonly"


def test_disable_autoload(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(site, _dist(site), {"kael.backends": {"primonly": PRIMITIVES_ONLY}})
    monkeypatch.setenv("KAEL_DISABLE_PLUGIN_AUTOLOAD", "1")
    pm = PluginManager()
    assert pm.select("cpu").name == "reference" and not pm.records
    assert not [m for m in sys.modules if m.startswith(_dist(site))]
    pm.register(_plugin_object("by-hand", "cpu", 9), "by-hand")  # explicit registration still works
    assert pm.select("cpu").name == "by-hand"


def test_block_list(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(site, _dist(site), {"kael.backends": {"primonly": PRIMITIVES_ONLY, "broken": RAISES}})
    monkeypatch.setenv("KAEL_BLOCK_PLUGINS", "broken, primonly")
    pm = PluginManager()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a blocked plugin is never imported, so it cannot fail
        assert pm.select("cpu").name == "reference"
    assert pm.records["kael.backends:primonly"].status == "blocked"
    assert pm.records["kael.backends:broken"].status == "blocked"
    with pytest.raises(kael.PluginError, match="blocked"):
        pm.register(_plugin_object("primonly", "cpu", 1), "primonly")
    monkeypatch.delenv("KAEL_BLOCK_PLUGINS")
    pm2 = PluginManager()
    pm2.block("primonly")
    pm2.block("broken")
    assert pm2.select("cpu").name == "reference"


def test_api_version_major_mismatch_is_refused(site: Path) -> None:
    install(site, _dist(site), {"kael.backends": {"future": _backend_module("future", "cpu", 50, api="2.0")}})
    pm = PluginManager()
    with pytest.warns(RuntimeWarning, match=r"'future'.*speaks backend API 2.0; this kael speaks 1\.\d"):
        assert pm.select("cpu").name == "reference"
    assert pm.records["kael.backends:future"].status == "failed"
    with pytest.raises(kael.PluginError, match="major versions must match"):
        PluginManager().register(_plugin_object("future2", "cpu", 1, api="0.9"), "future2")
    pm.register(_plugin_object("minor", "cpu", 60, api="1.99"), "minor")  # a newer minor is fine
    assert pm.select("cpu").name == "minor"


def test_plugins_group_is_loaded_separately(site: Path) -> None:
    info = """
        import kael

        @kael.hookimpl
        def kael_plugin_info():
            return {"name": "extra", "version": "9", "description": "test tooling"}
    """
    install(site, _dist(site), {"kael.plugins": {"extra": info}, "kael.backends": {"primonly": PRIMITIVES_ONLY}})
    pm = PluginManager()
    pm.select("cpu")
    assert "kael.plugins:extra" not in pm.records, "kael.plugins loaded on first device use"
    pm.ensure_loaded("kael.plugins")
    assert pm.records["kael.plugins:extra"].status == "loaded"
    assert pm.pm.hook.kael_plugin_info() == [{"name": "extra", "version": "9", "description": "test tooling"}]


def _plugin_object(name: str, device_type: str, priority: int, api: str = "1.0") -> Any:
    backend = type(
        "B", (ReferenceBackend,), {"name": name, "device_type": device_type, "priority": priority, "api_version": api}
    )()

    class Plugin:
        @kael.hookimpl
        def kael_backends(self) -> list[Any]:
            return [backend]

    return Plugin()


# -- the global manager: kael.backends.use and the dispatch cache -------------------------------------


@pytest.fixture
def registered() -> Iterator[None]:
    kael.backends.register(_plugin_object("test-low", "cpu", -10), "test-low")
    try:
        yield
    finally:
        kael.backends.use("cpu", None)
        manager.unregister("test-low")


def test_backends_use_switches_and_restores(registered: None) -> None:
    before = kael.backends.current("cpu")
    assert before.name != "test-low"
    kael.backends.use("cpu", "test-low")
    assert kael.backends.current("cpu").name == "test-low"
    assert (kael.ones(2) + 1).tolist() == [2.0, 2.0]
    kael.backends.use("cpu", None)
    assert kael.backends.current("cpu") is before
    with pytest.raises(kael.BackendError, match="no backend named 'nope'"):
        kael.backends.use("cpu", "nope")
    assert any(b.name == "test-low" for b in kael.backends.available())


def test_dispatch_resolves_once_and_invalidates(registered: None, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real_select = manager.select

    def counting(device_type: str) -> Any:
        calls.append(device_type)
        return real_select(device_type)

    monkeypatch.setattr(manager, "select", counting)
    _dispatch.clear_cache()
    a = kael.ones(4)
    for _ in range(50):
        a = a + 1.0
    assert a.tolist() == [51.0] * 4
    assert len(calls) <= 3, f"the dispatcher asked the plugin manager {len(calls)} times for 50 ops"
    kernel = _dispatch.kernel("cpu", "add")
    assert _dispatch.kernel("cpu", "add") is kernel
    kael.backends.use("cpu", "test-low")  # switching clears the cache: the next lookup resolves afresh
    assert _dispatch.kernel("cpu", "add") is kael.backends.current("cpu").kernel("add")


def test_unknown_device_type() -> None:
    with pytest.raises(kael.DeviceError, match="no backend serves device type 'nosuchdev'"):
        kael.zeros(1, device="nosuchdev")


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
