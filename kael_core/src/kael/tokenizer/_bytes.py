"""GPT-2's reversible table between the 256 byte values and printable characters.

Byte-level BPE works on bytes, but GPT-2's ``vocab.json`` and ``merges.txt`` store
tokens as text. Each byte is shown as one printable character: the printable
Latin-1 bytes stand for themselves, the other 68 (control characters, space,
``0x7F``-``0xA0``, ``0xAD``) are shifted to U+0100.. in byte order. So the space
byte is ``"Ġ"`` (U+0120) and a newline is ``"Ċ"`` (U+010A).
"""

from __future__ import annotations

__all__ = ["BYTE_TO_CHAR", "CHAR_TO_BYTE", "BYTE_CHARS", "token_to_bytes"]


def _build_table() -> tuple[str, ...]:
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table: dict[int, str] = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return tuple(table[b] for b in range(256))


BYTE_TO_CHAR: tuple[str, ...] = _build_table()
"""``BYTE_TO_CHAR[b]`` is the character that stands for byte ``b``."""

CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
"""The inverse of :data:`BYTE_TO_CHAR`."""

BYTE_CHARS: frozenset[str] = frozenset(BYTE_TO_CHAR)
"""Every character a byte-level token may contain."""

# str.translate table from the byte-level characters back to Latin-1 code points,
# so that ``token.translate(_TO_LATIN1).encode("latin-1")`` recovers the bytes.
_TO_LATIN1: dict[int, int] = {ord(c): b for b, c in enumerate(BYTE_TO_CHAR)}


def token_to_bytes(token: str) -> bytes:
    """The bytes a byte-level token string stands for (every char must be in the table)."""
    return token.translate(_TO_LATIN1).encode("latin-1")
