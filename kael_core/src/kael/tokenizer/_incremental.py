"""``IncrementalDecoder``: decode token ids one at a time into complete characters.

A token may end in the middle of a UTF-8 sequence (GPT-2 spells many characters
and emoji as two or three byte tokens), so printing each token's decoded text at
once would show replacement characters. This decoder holds back an incomplete
sequence until the tokens that complete it arrive; concatenated, its outputs and
``flush()`` equal ``tokenizer.decode_text(all_ids, errors)``.

It works over any tokenizer whose ``decode(ids)`` returns bytes (``SupportsDecode``):
kael's ``BpeTokenizer``, kael-server's streaming output and a test's byte tokenizer
all share this one decoder.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from typing import Protocol

__all__ = ["IncrementalDecoder", "SupportsDecode"]


class SupportsDecode(Protocol):
    """A tokenizer as ``IncrementalDecoder`` uses it: the bytes a list of token ids stands for."""

    def decode(self, ids: list[int]) -> bytes: ...


class IncrementalDecoder:
    """Streams text from token ids: ``add(id)`` returns the characters now complete.

    Bytes that can never form a character follow ``errors`` (``"replace"``: U+FFFD, as
    ``bytes.decode``), but a valid character split across tokens is never broken: the
    byte tokens ``C3``, ``B1``, ``E2``, ``82``, ``AC`` added one by one give ``""``,
    ``"ñ"``, ``""``, ``""``, ``"€"``.

    >>> decoder = tokenizer.incremental_decoder()  # doctest: +SKIP
    >>> for token_id in ids:  # doctest: +SKIP
    ...     print(decoder.add(token_id), end="")
    >>> print(decoder.flush())  # doctest: +SKIP
    """

    def __init__(self, tokenizer: SupportsDecode, errors: str = "replace") -> None:
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors)

    def add(self, token_id: int) -> str:
        """Take one id; return the text completed by it (maybe ``""``)."""
        return self._utf8.decode(self._tokenizer.decode([token_id]))

    def add_many(self, ids: Iterable[int]) -> str:
        """Take several ids at once; return the text they complete."""
        return self._utf8.decode(self._tokenizer.decode(list(ids)))

    def flush(self) -> str:
        """End the stream: return what is held back (incomplete bytes per ``errors``), reset."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text

    def reset(self) -> None:
        """Drop anything held back and start a new stream."""
        self._utf8.reset()
