"""The plugin mechanism in process: entry-point backends, failure isolation, selection and overrides.

Plugins are installed on the fly (plugin_dists.py) in a temporary directory on the path,
and each test uses a fresh ``PluginManager`` (the global one is left alone): lazy
discovery, failing plugins reported and skipped (or re-raised when strict), priority
conflicts, overrides by environment and ``use``, autoload off, block lists, API versions,
the ``kael.plugins`` group. Then the global manager: ``kael.backends.use`` and the
dispatch cache, and unknown device types.
"""

from __future__ import annotations

import sys
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
from plugin_dists import PRIMITIVES_ONLY, RAISES, install


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
