r"""GPT-2's pre-tokenizer: split text into the pieces that BPE then encodes one by one.

The pieces are exactly the matches of GPT-2's pattern

    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+

(``\p{L}`` letters, ``\p{N}`` numbers, ``\s`` Unicode White_Space). Python's ``re``
has no ``\p{..}`` classes, so the ``regex`` package defines them.

NOTE [two engines, one pattern]: ``regex`` is about half as fast as the standard
library's ``re`` on this pattern. So for text without astral code points (above
U+FFFF; that is nearly all text but emoji and a few rare scripts) we run ``re`` on
the same pattern with the three classes spelled out as explicit ranges, computed
once by asking ``regex`` which of the 65,536 BMP code points are letters, numbers
and whitespace. Both engines therefore classify every code point alike and give
the same pieces; ``tests/core/test_tokenizer.py`` checks it. Astral code points
go to ``regex``: spelling out their ranges would make ``re`` scan hundreds of
ranges per character.

NOTE [blocks]: so that one emoji does not send a whole long text to the slower
engine, long text is cut into blocks of about ``BLOCK`` characters, each sent to
the engine its own content needs. A block ends where a non-whitespace character
is followed by whitespace: no piece spans such a point (the whitespace in a
piece is either all of it or one leading space), and the ``(?!\S)`` look-ahead
cannot reach past it (a block's last character is not whitespace), so matching
block by block gives exactly the pieces of the whole.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import regex

__all__ = ["pretokenize", "GPT2_PATTERN", "BLOCK"]

# The alternatives that start with a letter, a digit or a space come first: their
# first characters differ from "'" so reordering them cannot change a match, and
# they match far more often than the contractions.
GPT2_PATTERN = r""" ?\p{L}+| ?\p{N}+|'(?:[sdmt]|ll|ve|re)| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

_ASTRAL = re.compile("[\U00010000-\U0010ffff]")

_Findall = Callable[[str], list[str]]
_Search = Callable[[str, int], "re.Match[str] | None"]


@functools.cache
def _full_findall() -> _Findall:
    """The ``regex`` engine: handles every code point."""
    findall: _Findall = regex.compile(GPT2_PATTERN).findall
    return findall


def _ranges(class_pattern: str, bmp: str) -> str:
    """``class_pattern``'s BMP code points as the body of an ``re`` character class."""
    spans = (m.span() for m in regex.finditer(class_pattern + "+", bmp))
    return "".join(
        re.escape(bmp[start]) if end - start == 1 else f"{re.escape(bmp[start])}-{re.escape(bmp[end - 1])}"
        for start, end in spans
    )


@functools.cache
def _bmp_engine() -> tuple[_Findall, _Search]:
    """The ``re`` engine (exact for text without astral code points) and block-end search."""
    bmp = "".join(map(chr, range(0x10000)))
    letter, number, space = (_ranges(c, bmp) for c in (r"\p{L}", r"\p{N}", r"\s"))
    pattern = (
        f" ?[{letter}]+| ?[{number}]+|'(?:[sdmt]|ll|ve|re)| ?[^{space}{letter}{number}]+"
        f"|[{space}]+(?![^{space}])|[{space}]+"
    )
    block_end = f"[^{space}](?=[{space}])"  # a block ends at this match's end
    return re.compile(pattern).findall, re.compile(block_end).search


BLOCK = 1024
"""Text with astral code points is pre-tokenized in blocks of about this many characters."""


def pretokenize(text: str) -> list[str]:
    """Split ``text`` into GPT-2's pre-tokens (concatenated, they give back ``text``)."""
    findall, search_block_end = _bmp_engine()
    if text.isascii() or _ASTRAL.search(text) is None:
        return findall(text)
    full_findall = _full_findall()
    if len(text) <= BLOCK:
        return full_findall(text)
    pieces: list[str] = []
    start, n = 0, len(text)
    while start < n:
        match = search_block_end(text, start + BLOCK - 1)
        end = n if match is None else match.end()
        block = text[start:end]
        pieces += findall(block) if _ASTRAL.search(block) is None else full_findall(block)
        start = end
    return pieces
