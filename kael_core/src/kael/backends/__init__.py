"""``kael.backends``: the public contract between kael and its plugins (API_VERSION 1.4).

Everything a compute backend, the debug tooling, the server or the conformance kit
needs from kael is here, documented for a plugin author (``kael_core/BACKENDS.md`` lists
it name by name):

* this module: ``Backend`` (the base class), ``API_VERSION``, backend selection
  (``use``, ``available``, ``current``, ``override``), plugin registration by hand
  (``register``, ``unregister``) and hook objects (``register_hooks``,
  ``unregister_hooks``, ``hooks_registered``: objects implementing ``kael.hookspecs``
  hooks, such as backward observers, registered without loading any backend);
* ``catalogue``: every op with its arity, attributes and exact kernel signature, the op
  families, and each fused op's decomposition;
* ``dtypes``: the dtype tables;
* ``host``: NumPy helpers for CPU-memory backends (strided views, reads and writes,
  bfloat16 bits, the compute dtype), the seeded random kernels, and the NumPy
  host-kernel library (``host.kernel("attention")``) the reference backend serves;
* ``memory``: a tensor's storage, strides and views as a backend sees them, and
  ``wrap_buffer`` to hand a device buffer back as a tensor;
* ``dispatch``: which backend serves a device type, kernels by op name, and the kernel
  wrapper hook.

``kael.backends.reference`` is the NumPy reference backend itself; no plugin imports it.
"""

from __future__ import annotations

from . import catalogue, dispatch, dtypes, host, memory
from ._base import API_VERSION, Backend

__all__ = [
    "Backend",
    "API_VERSION",
    "use",
    "override",
    "available",
    "current",
    "register",
    "unregister",
    "register_hooks",
    "unregister_hooks",
    "hooks_registered",
    "catalogue",
    "dtypes",
    "host",
    "memory",
    "dispatch",
]


def use(device_type: str, name: str | None) -> None:
    """Serve device_type with the backend called name (None: back to priority order)."""
    from .._plugins import manager

    manager.use(device_type, name)


def override(device_type: str) -> str | None:
    """The backend name ``use`` set for device_type, or None (priority order or ``KAEL_BACKEND_<TYPE>``)."""
    from .._plugins import manager

    return manager.overrides.get(device_type)


def available() -> list[Backend]:
    """Every registered backend (loading the kael.backends entry points first)."""
    from .._plugins import manager

    manager.ensure_loaded("kael.backends")
    return list(manager.backends)


def current(device_type: str = "cpu") -> Backend:
    """The backend that serves device_type now."""
    from .._plugins import manager

    return manager.select(device_type)


def register(plugin: object, name: str) -> None:
    """Register a plugin object (one implementing kael_backends) by hand, as an entry point would."""
    from .._plugins import manager

    manager.ensure_loaded("kael.backends")
    manager.register(plugin, name)


def unregister(name: str) -> None:
    """Unregister the plugin called name and the backends it provided."""
    from .._plugins import manager

    manager.unregister(name)


def register_hooks(hooks: object, name: str) -> None:
    """Register an object implementing ``kael.hookspecs`` hooks (``@kael.hookimpl`` methods) under name.

    Unlike ``register``, nothing else happens: no backend is loaded or looked for, and
    ``python -m kael info`` does not list it. Registering a name again replaces it.
    """
    from .._plugins import manager

    manager.register_hooks(hooks, name)


def unregister_hooks(name: str) -> None:
    """Unregister the hook object registered under name (nothing happens if there is none)."""
    from .._plugins import manager

    manager.unregister_hooks(name)


def hooks_registered(name: str) -> bool:
    """Whether a hook object (or plugin) is registered under name."""
    from .._plugins import manager

    return manager.has_plugin(name)
