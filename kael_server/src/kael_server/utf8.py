"""Incremental UTF-8 decoding of token bytes, so a character split across tokens is emitted whole."""

from __future__ import annotations

import codecs


class Utf8Stream:
    """Turns a sequence of byte chunks into text pieces, holding back incomplete characters.

    Invalid sequences become U+FFFD (as GPT-2 can emit bytes that never form a character),
    but a valid multi-byte character split across chunks is never broken: the bytes
    ``C3``, ``B1``, ``E2``, ``82``, ``AC`` fed one by one give ``""``, ``"ñ"``, ``""``, ``""``, ``"€"``.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        """Ends the stream: a dangling partial character becomes U+FFFD."""
        return self._decoder.decode(b"", final=True)
