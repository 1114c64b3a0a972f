"""What BlockPool answers (Allocation, AppendResult) and what it keeps per live sequence (SeqState)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RELEASED", "Allocation", "AppendResult", "SeqState"]

#: A block-table entry whose block the sequence gave back (NOTE [released blocks] in _kv_blocks.py).
RELEASED = -1


@dataclass(frozen=True)
class Allocation:
    """A sequence's blocks, and how many leading tokens already have their K/V in them.

    ``cached_tokens`` is at most ``len(tokens) - 1`` after ``allocate`` (at least the last prompt
    token is computed, so the caller gets its logits): the caller prefills positions
    ``cached_tokens`` onwards. When it is not a multiple of the block size ``s``,
    ``copied_from`` names a registered block whose first ``cached_tokens % s`` slots the caller
    copies into ``block_table[cached_tokens // s]`` first (NOTE [partial block] in
    _kv_blocks.py). After ``fork`` it is the whole length (nothing to compute).
    """

    block_table: tuple[int, ...]
    cached_tokens: int
    copied_from: int | None = None


@dataclass(frozen=True)
class AppendResult:
    """Where an appended position's K/V goes: slot ``slot`` of block ``block``.

    ``copied_from`` is None, or the shared block whose slots ``[0, slot)`` the caller copies
    into ``block`` before writing (NOTE [copy-on-write]).
    """

    block: int
    slot: int
    copied_from: int | None = None


class SeqState:
    """A live sequence's tokens, block table and the chain state of its last full block."""

    __slots__ = ("last_cid", "last_key", "table", "tokens")

    def __init__(self, tokens: list[int], table: list[int], last_key: bytes, last_cid: int) -> None:
        self.tokens = tokens  # every token id of the sequence, prompt and appended
        self.table = table  # block ids (leading ones may be RELEASED), len == ceil(len(tokens) / block_size)
        self.last_key = last_key  # chained key of the last full block (b"" before the first)
        self.last_cid = last_cid  # its content id (0: the empty prefix)
