"""The per-token steps of a ``tokenizer.json`` ``"decoder"``: how kael turns one token's string into its bytes.

``HFTokenizer.decode`` maps each token through these steps (byte-level characters to bytes,
``<0xHH>`` byte-fallback tokens to their byte, a ``Replace``/``Metaspace`` replacement such
as ``▁`` to a space), so a character split over several tokens is whole once their bytes
are joined; the decoder's leading ``Strip`` (or Metaspace's prefix space) is returned
apart, as it applies to the first token of a text only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kael.tokenizer._bytes import CHAR_TO_BYTE

__all__ = ["Piece", "Step", "byte_level", "decoder_steps"]

Piece = str | bytes
Step = Callable[[Piece], Piece]


def decoder_steps(decoder: Any) -> tuple[list[Step], tuple[str, int] | None]:
    """The per-token steps of a ``tokenizer.json`` ``"decoder"``, and its leading strip (content, count)."""
    steps: list[Step] = []
    strip: tuple[str, int] | None = None
    for part in _flatten(decoder):
        kind = part.get("type")
        if kind == "ByteLevel":
            steps.append(byte_level)
        elif kind == "ByteFallback":
            steps.append(_byte_fallback)
        elif kind == "Replace":
            pattern = part.get("pattern")
            content = part.get("content")
            if isinstance(pattern, dict) and isinstance(pattern.get("String"), str) and isinstance(content, str):
                steps.append(_replace(pattern["String"], content))
        elif kind == "Metaspace":
            replacement = part.get("replacement", "▁")
            if isinstance(replacement, str):
                steps.append(_replace(replacement, " "))
            if part.get("prepend_scheme", "always") != "never" and part.get("add_prefix_space", True) is not False:
                strip = (" ", 1)
        elif kind == "Strip":
            content, start = part.get("content", " "), part.get("start", 0)
            if isinstance(content, str) and type(start) is int and start > 0:
                strip = (content, start)
        # Fuse joins tokens (a no-op per token); other decoders pass token text through.
    return steps, strip


def _flatten(decoder: Any) -> list[dict[str, Any]]:
    if not isinstance(decoder, dict):
        return []
    if decoder.get("type") == "Sequence":
        parts = decoder.get("decoders")
        return [p for sub in parts for p in _flatten(sub)] if isinstance(parts, list) else []
    return [decoder]


def byte_level(piece: Piece) -> Piece:
    if isinstance(piece, bytes):
        return piece
    out = bytearray()
    for char in piece:
        byte = CHAR_TO_BYTE.get(char)
        if byte is None:
            out += char.encode("utf-8")
        else:
            out.append(byte)
    return bytes(out)


def _byte_fallback(piece: Piece) -> Piece:
    if isinstance(piece, str) and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            return piece
    return piece


def _replace(old: str, new: str) -> Step:
    def step(piece: Piece) -> Piece:
        return piece.replace(old, new) if isinstance(piece, str) and old else piece

    return step
