"""Stop strings over streamed text: cut at the first stop, holding back partial matches."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopMatcher"]


class StopMatcher:
    """Feeds text pieces in order and releases only text that cannot be part of a stop string.

    The output is cut at the stop string that completes first (earliest end; on a tie, the
    one that starts first), which is what a client would see if it had the whole text at
    once and streaming never changed the result. Text that could still become a stop string
    is held back across pieces, so a stop split over several events is never leaked.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """Returns the text that is now safe to send; sets ``stopped`` once a stop string completes."""
        if self.stopped:
            return ""
        if not self._stops:
            return piece
        text = self._held + piece
        cut = _first_stop(text, self._stops)
        if cut is not None:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = _longest_partial_suffix(text, self._stops)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """Ends the text: what was held back is no stop string, so it is released."""
        held, self._held = self._held, ""
        return held


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """The start of the stop occurrence that ends first in ``text``, or None."""
    best: tuple[int, int] | None = None  # (end, start)
    for stop in stops:
        start = text.find(stop)
        if start >= 0:
            candidate = (start + len(stop), start)
            if best is None or candidate < best:
                best = candidate
    return None if best is None else best[1]


def _longest_partial_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
