"""Plugin discovery and the backend registry.

Plugins come from two entry-point groups, ``kael.backends`` and ``kael.plugins``,
and load lazily: on the first use of a device (backends) or of a plugin feature.
A plugin that raises while loading is reported by name and skipped, unless
``KAEL_STRICT_PLUGINS=1`` (then the original exception propagates).
``KAEL_DISABLE_PLUGIN_AUTOLOAD=1`` skips entry points altogether, and
``KAEL_BLOCK_PLUGINS=a,b`` (or ``block()``) skips the named ones.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, cast

import pluggy

from ._errors import BackendError, DeviceError, PluginError
from .backends._base import API_VERSION, Backend
from .hookspecs import KaelSpecs

__all__ = ["PluginManager", "manager", "PluginRecord"]

GROUPS = ("kael.backends", "kael.plugins")


@dataclass
class PluginRecord:
    name: str
    group: str
    value: str
    dist: str = ""
    version: str = ""
    status: str = "not loaded"  # loaded | failed | blocked | disabled
    error: str = ""
    backends: list[str] = field(default_factory=list)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "false", "False", "no")


class PluginManager:
    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("kael")
        self.pm.add_hookspecs(KaelSpecs)
        self.records: dict[str, PluginRecord] = {}
        self.backends: list[Backend] = []
        self.overrides: dict[str, str] = {}
        self.blocked: set[str] = {b.strip() for b in os.environ.get("KAEL_BLOCK_PLUGINS", "").split(",") if b.strip()}
        self.generation = 0
        self._loaded_groups: set[str] = set()
        self._lock = threading.RLock()
        self._selected: dict[str, Backend] = {}

    # -- discovery --------------------------------------------------------------
    def ensure_loaded(self, group: str) -> None:
        if group in self._loaded_groups:
            return
        with self._lock:
            if group in self._loaded_groups:
                return
            self._loaded_groups.add(group)
            if group == "kael.backends":
                from .backends import reference

                self._add_backends("builtin", [reference.ReferenceBackend()])
            if _env_flag("KAEL_DISABLE_PLUGIN_AUTOLOAD"):
                return
            for ep in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
                self._load_entry_point(ep, group)

    def _load_entry_point(self, ep: metadata.EntryPoint, group: str) -> None:
        dist = ep.dist.name if ep.dist is not None else ""
        rec = PluginRecord(ep.name, group, ep.value, dist, ep.dist.version if ep.dist is not None else "")
        self.records[f"{group}:{ep.name}"] = rec
        if ep.name in self.blocked:
            rec.status = "blocked"
            return
        try:
            obj = ep.load()
            self.register(obj, name=ep.name, record=rec)
        except Exception as exc:  # a broken plugin must not break kael
            rec.status = "failed"
            rec.error = f"{type(exc).__name__}: {exc}"
            if _env_flag("KAEL_STRICT_PLUGINS"):
                raise
            warnings.warn(
                f"kael: plugin {ep.name!r} ({ep.value}) failed to load and was skipped: {rec.error}",
                RuntimeWarning,
                stacklevel=2,
            )

    def register(self, obj: Any, name: str, record: PluginRecord | None = None) -> None:
        """Register a plugin object by hand (tests, notebooks) as an entry point would."""
        with self._lock:
            if name in self.blocked:
                raise PluginError(f"plugin {name!r} is blocked")
            if self.pm.get_plugin(name) is not None:
                self.pm.unregister(name=name)
            self.pm.register(obj, name=name)
            rec = record or PluginRecord(name, "manual", repr(obj))
            self.records.setdefault(f"{rec.group}:{name}", rec)
            try:
                found: list[Backend] = []
                for impl in self.pm.hook.kael_backends.get_hookimpls():
                    if impl.plugin_name == name:
                        found.extend(cast("list[Backend]", impl.function() or []))
                self._add_backends(name, found)
            except Exception:
                self.pm.unregister(name=name)
                raise
            rec.status = "loaded"
            rec.backends = [b.name for b in found]

    def _add_backends(self, plugin: str, found: list[Backend]) -> None:
        for b in found:
            if not isinstance(b, Backend):
                raise PluginError(
                    f"plugin {plugin!r} returned {b!r} from kael_backends; expected kael.Backend instances"
                )
            major = str(b.api_version).split(".")[0]
            if major != API_VERSION.split(".")[0]:
                raise PluginError(
                    f"backend {b.name!r} from plugin {plugin!r} speaks backend API {b.api_version}; "
                    f"this kael speaks {API_VERSION} (major versions must match)"
                )
            if not b.name or not b.device_type:
                raise PluginError(f"backend {b!r} from plugin {plugin!r} must set name and device_type")
        self.backends = [x for x in self.backends if x.name not in {b.name for b in found}] + list(found)
        self.invalidate()

    def register_hooks(self, hooks: object, name: str) -> None:
        """Register a hook object under name with pluggy only (no backends looked for, no record)."""
        with self._lock:
            if self.pm.get_plugin(name) is not None:
                self.pm.unregister(name=name)
            self.pm.register(hooks, name=name)

    def unregister_hooks(self, name: str) -> None:
        with self._lock:
            if self.pm.get_plugin(name) is not None:
                self.pm.unregister(name=name)

    def has_plugin(self, name: str) -> bool:
        return self.pm.get_plugin(name) is not None

    def unregister(self, name: str) -> None:
        with self._lock:
            rec = next((r for r in self.records.values() if r.name == name), None)
            if rec is not None:
                self.backends = [b for b in self.backends if b.name not in rec.backends]
            if self.pm.get_plugin(name) is not None:
                self.pm.unregister(name=name)
            self.records = {k: v for k, v in self.records.items() if v.name != name}
            self.invalidate()

    def block(self, name: str) -> None:
        self.blocked.add(name)

    def invalidate(self) -> None:
        """Forget selected backends and cached kernels (NOTE [dispatch cache])."""
        self._selected.clear()
        self.generation += 1
        from . import _dispatch

        _dispatch.clear_cache()

    # -- selection --------------------------------------------------------------
    def candidates(self, device_type: str) -> list[Backend]:
        self.ensure_loaded("kael.backends")
        return [b for b in self.backends if b.device_type == device_type]

    def use(self, device_type: str, name: str | None) -> None:
        with self._lock:
            if name is None:
                self.overrides.pop(device_type, None)
            else:
                if not any(b.name == name for b in self.candidates(device_type)):
                    raise BackendError(
                        f"backends.use: no backend named {name!r} serves {device_type!r}; "
                        f"installed: {[b.name for b in self.candidates(device_type)]}"
                    )
                self.overrides[device_type] = name
            self.invalidate()

    def select(self, device_type: str) -> Backend:
        found = self._selected.get(device_type)
        if found is not None:
            return found
        with self._lock:
            cands = self.candidates(device_type)
            if not cands:
                raise DeviceError(
                    f"no backend serves device type {device_type!r}; installed backends serve "
                    f"{sorted({b.device_type for b in self.backends})}"
                )
            want = self.overrides.get(device_type) or os.environ.get(f"KAEL_BACKEND_{device_type.upper()}")
            if want:
                named = [b for b in cands if b.name == want]
                if not named:
                    raise BackendError(
                        f"backend {want!r} requested for {device_type!r} is not installed; "
                        f"candidates: {[b.name for b in cands]}"
                    )
                chosen = named[0]
            else:
                top = max(b.priority for b in cands)
                best = [b for b in cands if b.priority == top]
                if len(best) > 1:
                    raise BackendError(
                        f"backends {best[0].name!r} and {best[1].name!r} both serve {device_type!r} at priority "
                        f"{top}; choose one with KAEL_BACKEND_{device_type.upper()}=NAME or kael.backends.use()"
                    )
                chosen = best[0]
            ok, reason = chosen.is_available()
            if not ok:
                raise DeviceError(f"device type {device_type!r}: backend {chosen.name!r} is unavailable: {reason}")
            self._selected[device_type] = chosen
            return chosen


manager = PluginManager()


def loaded_plugin_modules() -> list[str]:
    return sorted(m for m in sys.modules if m.startswith("kael_"))
