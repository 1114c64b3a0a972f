"""Backends: the registry's public face (use, list, the Backend base class)."""

from __future__ import annotations

from ._base import API_VERSION, Backend

__all__ = ["Backend", "API_VERSION", "use", "available", "current", "register"]


def use(device_type: str, name: str | None) -> None:
    """Serve device_type with the backend called name (None: back to priority order)."""
    from .._plugins import manager

    manager.use(device_type, name)


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
    """Register a plugin object (one implementing kael_backends) by hand."""
    from .._plugins import manager

    manager.ensure_loaded("kael.backends")
    manager.register(plugin, name)
