"""Draft proposers for speculative decoding: the ``Proposer`` protocol and ``NgramProposer``.

A proposer guesses the tokens that follow a request's ids; the target model verifies them in
one multi-token step (speculative.py), so a guess only changes how fast the output comes, never
what it is. ``NgramProposer`` is prompt lookup (vLLM's ``ngram``, llama.cpp's
``ngram-simple``): the last ``n`` ids are searched for earlier in the prompt and output, and
the ids that followed the most recent earlier occurrence are proposed (read on periodically
where they run into the end); ``n`` goes from
``n_max`` down to ``n_min`` until one matches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from .._errors import KaelError
from .request import Request

__all__ = ["NgramProposer", "Proposer", "count_arg", "ngram_lookup"]


@runtime_checkable
class Proposer(Protocol):
    """What speculative decoding asks of a proposer: ``propose(request, k)``, at most ``k``
    draft token ids to follow ``request.all_ids`` (an empty list: nothing to propose), and
    ``release(request)`` once the request is done (whatever the proposer keeps for it goes)."""

    def propose(self, request: Request, k: int) -> list[int]:
        """Up to ``k`` token ids guessed to follow ``request``'s prompt and output."""

    def release(self, request: Request) -> None:
        """``request`` finished: forget it."""


def count_arg(op: str, name: str, value: object, lo: int) -> int:
    """``value`` if it is an int >= ``lo`` (not a bool), else a KaelError naming ``op`` and ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise KaelError(f"{op}: {name} must be an int >= {lo}, got {value!r}")
    return value


def ngram_lookup(ids: Sequence[int] | np.ndarray, n_max: int, n_min: int, k: int) -> list[int]:
    """The ``k`` ids that followed the most recent earlier occurrence of ``ids``' last ``n`` ids,
    for the largest ``n`` in ``n_max..n_min`` that occurs earlier (empty if none does). Where the
    match is so recent that fewer than ``k`` ids follow it, the continuation reads on through the
    ids it proposes itself (a repeating pattern keeps repeating: ``[1, 2, 1, 2]`` -> ``1, 2, 1...``)."""
    length = len(ids)
    if k <= 0 or length < n_min + 1:
        return []
    arr = np.asarray(ids, dtype=np.int64)
    # where an earlier occurrence of the last id ends (each followed by at least one id): every match of
    # a longer tail ends at one of them, and most steps of a text with nothing to copy stop here
    ends = np.flatnonzero(arr[: length - 1] == arr[length - 1])
    if not ends.size:
        return []
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        hits = ends[ends >= n - 1]
        for back in range(1, n):
            hits = hits[arr[hits - back] == arr[length - 1 - back]]
        if hits.size:
            out: list[int] = []
            j = int(hits[-1]) + 1
            while len(out) < k:  # past the end, the continuation goes on through its own drafts
                out.append(int(arr[j]) if j < length else out[j - length])
                j += 1
            return out
    return []


class NgramProposer:
    """Prompt lookup: proposes what followed the most recent earlier occurrence of the request's
    last ``n`` ids (``n`` from ``n_max`` down to ``n_min``), at most ``k`` ids (module docstring).

    Each request's ids are kept as an array that grows with its output, so a lookup converts only
    the ids added since the last one, not the whole context at every step.
    """

    def __init__(self, n_max: int = 3, n_min: int = 1, k: int = 4) -> None:
        self.n_min = count_arg("NgramProposer", "n_min", n_min, 1)
        self.n_max = count_arg("NgramProposer", "n_max", n_max, 1)
        if self.n_max < self.n_min:
            raise KaelError(f"NgramProposer: n_max ({n_max}) must be >= n_min ({n_min})")
        self.k = count_arg("NgramProposer", "k", k, 1)
        self._ids: dict[Request, tuple[np.ndarray, int]] = {}

    def propose(self, request: Request, k: int) -> list[int]:
        """Up to ``min(k, self.k)`` ids following ``request.all_ids`` (see the class)."""
        return ngram_lookup(self._array(request), self.n_max, self.n_min, min(k, self.k))

    def _array(self, request: Request) -> np.ndarray:
        """``request``'s prompt and output ids as int64, converting only what was appended since the last call."""
        prompt, output = request.prompt_ids, request.output_ids
        start, length = len(prompt), len(prompt) + len(output)
        buf, have = self._ids.get(request, (None, 0))
        if buf is not None and 0 < have <= length:
            last = prompt[have - 1] if have <= start else output[have - 1 - start]
            if buf[have - 1] != last:
                buf = None  # (not a continuation of what was converted)
        if buf is None or have > length:
            buf, have = np.empty(max(64, 2 * length), dtype=np.int64), 0
        elif length > buf.size:
            buf = np.concatenate([buf[:have], np.empty(length, dtype=np.int64)])
        if have < start:
            buf[have:start] = prompt[have:]
        lo = max(have, start)
        if length > lo:
            buf[lo:length] = output[lo - start :]
        self._ids[request] = (buf, length)
        return buf[:length]

    def release(self, request: Request) -> None:
        """Drops the request's ids."""
        self._ids.pop(request, None)

    def __repr__(self) -> str:
        return f"NgramProposer(n_max={self.n_max}, n_min={self.n_min}, k={self.k})"
