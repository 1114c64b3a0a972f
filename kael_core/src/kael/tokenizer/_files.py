"""Reading and validating GPT-2's tokenizer files: ``vocab.json`` and ``merges.txt``.

``vocab.json`` is a JSON object from byte-level token strings (see ``_bytes``) to
ids; ``merges.txt`` lists the BPE merges, one ``left right`` pair a line, best
(lowest rank) first, after an optional ``#version`` header line. Every rule a file
breaks is reported as a ``FormatError`` that names the file and the rule; nothing
else escapes for malformed input.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from kael._errors import FormatError
from kael.tokenizer._bytes import BYTE_CHARS, BYTE_TO_CHAR

__all__ = ["parse_vocab", "parse_merges", "check_vocab", "check_merges"]


class _Pairs(list[tuple[str, object]]):
    """A JSON object's members in file order (so duplicate keys can be seen)."""


def _decode_utf8(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(f"{source}: not valid UTF-8 at byte {e.start}: {e.reason}") from None


def parse_vocab(data: bytes, source: str) -> dict[str, int]:
    """Parse and validate the bytes of a ``vocab.json`` (``source`` names it in errors)."""
    text = _decode_utf8(data, source)
    try:
        parsed = json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as e:
        raise FormatError(f"{source}: not valid JSON: {e}") from None
    except RecursionError:
        raise FormatError(f"{source}: not valid JSON: nested too deeply") from None
    if not isinstance(parsed, _Pairs):
        raise FormatError(f"{source}: expected a JSON object of token -> id, got {type(parsed).__name__}")
    encoder: dict[str, int] = {}
    for token, token_id in parsed:
        if token in encoder:
            raise FormatError(f"{source}: token {token!r} appears more than once")
        if type(token_id) is not int:
            raise FormatError(f"{source}: the id of token {token!r} must be an integer, got {token_id!r}")
        encoder[token] = token_id
    check_vocab(encoder, source)
    return encoder


def check_vocab(encoder: Mapping[str, int], source: str) -> None:
    """Check that ids are dense 0..n-1 and tokens are byte-level strings covering all bytes."""
    n = len(encoder)
    if n == 0:
        raise FormatError(f"{source}: the vocabulary is empty")
    owner: list[str | None] = [None] * n
    for token, token_id in encoder.items():
        if not isinstance(token, str) or not token:
            raise FormatError(f"{source}: tokens must be non-empty strings, got {token!r}")
        if type(token_id) is not int:
            raise FormatError(f"{source}: the id of token {token!r} must be an integer, got {token_id!r}")
        if not 0 <= token_id < n:
            raise FormatError(f"{source}: ids must be dense 0..{n - 1}, token {token!r} has id {token_id}")
        previous = owner[token_id]
        if previous is not None:
            raise FormatError(f"{source}: ids must be unique, {token_id} is the id of both {previous!r} and {token!r}")
        owner[token_id] = token
    if not set("".join(encoder)) <= BYTE_CHARS:
        bad = next(t for t in encoder if not set(t) <= BYTE_CHARS)
        char = next(c for c in bad if c not in BYTE_CHARS)
        raise FormatError(
            f"{source}: token {bad!r} is not a byte-level string: {char!r} (U+{ord(char):04X}) stands for no byte"
        )
    for byte, char in enumerate(BYTE_TO_CHAR):
        if char not in encoder:
            raise FormatError(
                f"{source}: the vocabulary lacks the token {char!r} for byte 0x{byte:02X}; byte-level BPE needs all 256"
            )


def parse_merges(data: bytes, source: str, encoder: Mapping[str, int]) -> list[tuple[str, str]]:
    """Parse and validate the bytes of a ``merges.txt`` against its vocabulary."""
    lines = _decode_utf8(data, source).split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line, it does not start a new one
    first = 1
    if lines and lines[0].startswith("#version"):
        del lines[0]
        first = 2
    merges: list[tuple[str, str]] = []
    for number, line in enumerate(lines, start=first):
        if line.endswith("\r"):
            line = line[:-1]  # tolerate CRLF: "\r" is never part of a byte-level token
        left, _, right = line.partition(" ")
        if not left or not right or " " in right:
            raise FormatError(f"{source}, line {number}: expected two tokens separated by one space, got {line!r}")
        merges.append((left, right))
    check_merges(merges, encoder, source, first_line=first)
    return merges


def check_merges(
    merges: Sequence[tuple[str, str]],
    encoder: Mapping[str, int],
    source: str,
    first_line: int | None = None,
) -> None:
    """Check that merges are distinct and that both parts and the result are tokens.

    Errors name ``source`` and the line (``first_line`` is the line of ``merges[0]``),
    or the index into ``merges`` when ``first_line`` is None (data not from a file).
    """
    seen: dict[tuple[str, str], int] = {}
    for index, merge in enumerate(merges):
        if (
            type(merge) is not tuple
            or len(merge) != 2
            or type(merge[0]) is not str
            or type(merge[1]) is not str
            or not merge[0]
            or not merge[1]
        ):
            raise FormatError(
                f"{_where(source, index, first_line)}: a merge is a pair of non-empty strings, got {merge!r}"
            )
        left, right = merge
        if left not in encoder or right not in encoder or left + right not in encoder:
            missing = next(p for p in (left, right, left + right) if p not in encoder)
            raise FormatError(
                f"{_where(source, index, first_line)}: merge {left!r} + {right!r} uses "
                f"{missing!r}, which is not in the vocabulary"
            )
        if merge in seen:
            raise FormatError(
                f"{_where(source, index, first_line)}: merge {left!r} + {right!r} repeats "
                f"{_where(source, seen[merge], first_line).removeprefix(source + ', ')}"
            )
        seen[merge] = index


def _where(source: str, index: int, first_line: int | None) -> str:
    if first_line is None:
        return f"{source}[{index}]"
    return f"{source}, line {index + first_line}"
