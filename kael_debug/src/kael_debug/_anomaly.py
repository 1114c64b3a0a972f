"""NaN anomaly detection in backward."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from . import _hooks

__all__ = ["set_anomaly_detection", "is_anomaly_enabled", "detect_anomaly"]


def set_anomaly_detection(enabled: bool) -> None:
    """After each node, raise KaelError naming it if a floating gradient it produced has a NaN."""
    _hooks.anomaly = bool(enabled)
    _hooks.sync()


def is_anomaly_enabled() -> bool:
    """Whether anomaly detection (a NaN gradient raises) is on."""
    return _hooks.anomaly


@contextmanager
def detect_anomaly() -> Iterator[None]:
    """Anomaly detection within the block: the first backward node producing a NaN gradient raises a KaelError
    naming it. The previous setting is restored on exit.
    """
    prev = _hooks.anomaly
    set_anomaly_detection(True)
    try:
        yield
    finally:
        set_anomaly_detection(prev)
