"""The error hierarchy: every user-facing error kael raises derives from KaelError."""

from __future__ import annotations

__all__ = [
    "KaelError",
    "ShapeError",
    "DTypeError",
    "DeviceError",
    "BackendError",
    "FormatError",
    "IndexError_",
    "AutogradError",
    "PluginError",
    "ChatTemplateError",
]


class KaelError(Exception):
    """Base class of all errors kael raises for bad input or bad state."""


class ShapeError(KaelError, ValueError):
    """Shapes that do not fit the op (broadcasting, matmul, views, ...)."""


class DTypeError(KaelError, TypeError):
    """A dtype the op does not accept, or a cast that is not allowed."""


class DeviceError(KaelError, RuntimeError):
    """Operands on different devices, or a device nobody serves."""


class BackendError(KaelError, RuntimeError):
    """A backend is missing, unavailable, conflicting or incompatible."""


class FormatError(KaelError, ValueError):
    """A file (safetensors, IDX, vocab, merges) that breaks its format."""


class IndexError_(KaelError, IndexError):
    """An index out of range (exported as kael.IndexError_ to avoid shadowing)."""


class AutogradError(KaelError, RuntimeError):
    """Backward through a freed graph, a modified saved tensor, and the like."""


class PluginError(KaelError, RuntimeError):
    """A plugin that failed to load or declared something invalid."""


class ChatTemplateError(KaelError, ValueError):
    """A chat template that fails to render the given messages (bad messages, or the template refuses them)."""
