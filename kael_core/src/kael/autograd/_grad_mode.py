"""Grad mode: whether ops record the autograd graph (thread-local, like PyTorch)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

__all__ = ["no_grad", "enable_grad", "set_grad_enabled", "inference_mode", "is_grad_enabled", "STATE"]

F = TypeVar("F", bound=Callable[..., Any])


class _State(threading.local):
    enabled: bool = True
    inference: bool = False


STATE = _State()


def is_grad_enabled() -> bool:
    """Whether ops on this thread record the autograd graph now (False inside ``no_grad`` and ``inference_mode``)."""
    return STATE.enabled


class _Mode:
    _value = True

    def __enter__(self) -> None:
        self._prev = STATE.enabled
        STATE.enabled = self._value

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        STATE.enabled = self._prev

    def __call__(self, fn: F) -> F:
        import functools

        mode = type(self)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with mode():
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class no_grad(_Mode):
    """Ops inside do not record a graph."""

    _value = False


class enable_grad(_Mode):
    """Turn recording back on inside a no_grad block."""

    _value = True


class set_grad_enabled(_Mode):
    """Turn graph recording on or off on this thread: at once, or for a ``with`` block.

    ``set_grad_enabled(False)`` takes effect when called (as a plain statement it stays in force);
    used as ``with set_grad_enabled(mode):`` the previous setting comes back when the block exits.
    """

    def __init__(self, mode: bool) -> None:
        self._value = bool(mode)
        self._prev = STATE.enabled
        STATE.enabled = self._value

    def __enter__(self) -> None:
        pass


class inference_mode(_Mode):
    """no_grad for inference; tensors made inside never require grad."""

    def __init__(self, mode: bool = True) -> None:
        self._value = not mode

    def __enter__(self) -> None:
        self._prev = STATE.enabled
        self._prev_inf = STATE.inference
        STATE.enabled = self._value
        STATE.inference = not self._value

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        STATE.enabled = self._prev
        STATE.inference = self._prev_inf
