"""``PieceCache``: a bounded map from pre-token to token ids that computes its misses.

Real text repeats a small set of pieces, so nearly every lookup hits. The cache is
a ``dict`` subclass whose ``__missing__`` runs BPE and stores the result, so that
``list(map(cache.__getitem__, pieces))`` encodes a whole text at C speed on hits.
It keeps at most ``max_entries`` pieces; when full, the older half (in insertion
order) is dropped. Pieces longer than ``max_piece_chars`` are computed every time:
they are rare and would pin a lot of memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from itertools import islice

__all__ = ["PieceCache"]


class PieceCache(dict[str, tuple[int, ...]]):
    """``cache[piece]`` is ``compute(piece)``, remembered for the next time."""

    __slots__ = ("_compute", "_lock", "_max_entries", "_max_piece_chars")

    def __init__(
        self,
        compute: Callable[[str], tuple[int, ...]],
        max_entries: int = 65_536,
        max_piece_chars: int = 256,
    ) -> None:
        super().__init__()
        self._compute = compute
        self._max_entries = max_entries
        self._max_piece_chars = max_piece_chars
        # Reads need no lock (a dict lookup is atomic); eviction must not race inserts.
        self._lock = threading.Lock()

    def __missing__(self, piece: str) -> tuple[int, ...]:
        ids = self._compute(piece)
        if len(piece) <= self._max_piece_chars:
            with self._lock:
                if len(self) >= self._max_entries:
                    for key in list(islice(self, len(self) - self._max_entries // 2)):
                        self.pop(key, None)
                self[piece] = ids
        return ids
