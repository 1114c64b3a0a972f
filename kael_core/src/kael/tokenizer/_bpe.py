"""The BPE merge loop: turn one pre-token's byte ids into its token ids.

Semantics (those of GPT-2's reference ``encoder.py`` and Hugging Face): among the
adjacent pairs, find the one whose merge has the lowest rank; merge every
occurrence of it, left to right without overlap; repeat until no adjacent pair is
a merge. Two implementations with identical results:

* ``merge_short``: the reference loop, which rescans all pairs per merge. It is
  O(n^2) but fastest for the short pieces that ordinary text consists of.
* ``merge_long``: a min-heap of candidate pairs keyed by (rank, position) over a
  doubly linked list of symbols, O(n log n), for long pieces such as 100,000
  repeated characters without a space.

Token ids stand for symbols throughout (see ``MergeTable``).
"""

from __future__ import annotations

import heapq
from itertools import pairwise

__all__ = ["MergeTable", "merge", "merge_short", "merge_long", "LONG_PIECE"]

LONG_PIECE = 20
"""Pieces with more symbols than this go to ``merge_long`` (measured break-even)."""

_NO_MERGE = 1 << 62  # a rank larger than any real one


class MergeTable:
    """The merges over token ids: ``ranks[(left, right)]`` is a merge's rank (0 is
    applied first) and ``results[rank]`` the id of the token it makes."""

    __slots__ = ("ranks", "results")

    def __init__(self, pairs: list[tuple[int, int]], results: list[int]) -> None:
        self.ranks = {pair: rank for rank, pair in enumerate(pairs)}
        self.results = results


def merge(ids: list[int], table: MergeTable) -> list[int]:
    """Apply the merges to ``ids`` (a piece's byte token ids); returns a new list."""
    if len(ids) > LONG_PIECE:
        return merge_long(ids, table)
    return merge_short(ids, table)


def merge_short(ids: list[int], table: MergeTable) -> list[int]:
    """The reference loop: rescan every adjacent pair for the best merge each round.

    (Plain loops beat ``min(map(...))`` and ``list.index`` tricks here: pieces are short.)
    """
    rank_of, results = table.ranks.get, table.results
    while len(ids) > 1:
        best = _NO_MERGE
        left = right = -1
        for pair in pairwise(ids):
            rank = rank_of(pair, _NO_MERGE)
            if rank < best:
                best = rank
                left, right = pair
        if best == _NO_MERGE:
            break
        merged = results[best]
        out: list[int] = []
        i, n = 0, len(ids)
        while i < n:  # copy ids, merging each (left, right) from the left
            if ids[i] == left and i + 1 < n and ids[i + 1] == right:
                out.append(merged)
                i += 2
            else:
                out.append(ids[i])
                i += 1
        ids = out
    return ids


def merge_long(ids: list[int], table: MergeTable) -> list[int]:
    """The heap loop: O(n log n) in the number of symbols, same result as ``merge_short``.

    Symbol ``i`` (its original position) holds ``symbols[i]``; ``next_[i]`` and
    ``prev[i]`` link the live symbols (-1 at the ends; ``symbols[i] == -1`` once
    merged into its left neighbour). A heap entry ``(rank, i)`` says the pair
    starting at ``i`` had that rank when pushed; it is stale if the pair has
    changed since, which re-looking-up the rank detects (ranks are unique per pair
    and symbols only ever grow, so a pair never comes back).

    To merge "every occurrence, left to right" exactly like ``merge_short``, all
    entries of the lowest rank are popped together (the heap yields them by
    position) and the pairs their merges create are pushed only afterwards.
    """
    n = len(ids)
    if n < 2:
        return list(ids)
    symbols = list(ids)
    next_ = list(range(1, n + 1))
    next_[-1] = -1
    prev = list(range(-1, n - 1))
    rank_of, results = table.ranks.get, table.results
    heap = [(rank, i) for i, pair in enumerate(pairwise(ids)) if (rank := rank_of(pair)) is not None]
    heapq.heapify(heap)
    while heap:
        rank, first = heapq.heappop(heap)
        batch = [first]
        while heap and heap[0][0] == rank:
            batch.append(heapq.heappop(heap)[1])
        merged = results[rank]
        created: list[int] = []  # positions whose pair with the next symbol is new
        for i in batch:
            j = next_[i]
            if symbols[i] == -1 or j == -1 or rank_of((symbols[i], symbols[j])) != rank:
                continue  # stale: the pair was merged away or changed
            symbols[i] = merged
            symbols[j] = -1
            k = next_[j]
            next_[i] = k
            if k != -1:
                prev[k] = i
                created.append(i)
            if prev[i] != -1:
                created.append(prev[i])
        for i in dict.fromkeys(created):  # each position once, in order
            j = next_[i]
            if symbols[i] != -1 and j != -1:
                new_rank = rank_of((symbols[i], symbols[j]))
                if new_rank is not None:
                    heapq.heappush(heap, (new_rank, i))
    return [s for s in symbols if s != -1]
