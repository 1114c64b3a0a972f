"""``BpeTokenizer``: GPT-2's byte-level BPE tokenizer (encode text to ids, decode back).

Encoding: split the text at the allowed special tokens, pre-tokenize each part
(``_pretokenize``), and map each piece to ids: from a bounded cache when seen
before, else by BPE over the piece's UTF-8 bytes (``_bpe``). Decoding joins each
id's bytes. Special tokens (GPT-2 has one, ``<|endoftext|>``) are vocabulary
tokens that stand for their literal text and that BPE never produces.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NoReturn

from kael._errors import DTypeError, FormatError, IndexError_, KaelError
from kael.tokenizer._bpe import MergeTable, merge
from kael.tokenizer._bytes import BYTE_TO_CHAR, token_to_bytes
from kael.tokenizer._cache import PieceCache
from kael.tokenizer._files import check_merges, check_vocab, parse_merges, parse_vocab
from kael.tokenizer._incremental import IncrementalDecoder
from kael.tokenizer._pretokenize import pretokenize

if TYPE_CHECKING:
    from kael.tokenizer._chat import ChatTemplate

__all__ = ["BpeTokenizer", "EOT"]

EOT = "<|endoftext|>"

_CACHE_ENTRIES = 65_536
"""At most this many pieces are cached (see ``PieceCache``)."""

_CACHE_PIECE_CHARS = 256
"""Longer pieces are not cached: they are rare and would pin a lot of memory."""

StrPath = str | os.PathLike[str]


class BpeTokenizer:
    """GPT-2's byte-level BPE tokenizer.

    >>> tok = BpeTokenizer.from_directory("tests/data/gpt2-tokenizer")  # doctest: +SKIP
    >>> tok.encode("Hello world")  # doctest: +SKIP
    [15496, 995]

    ``encoder`` maps byte-level token strings to dense ids 0..n-1 and ``merges``
    lists the merges, lowest rank first; both are validated (``FormatError``).
    ``special_tokens`` names the vocabulary's special tokens; by default
    ``<|endoftext|>`` if the vocabulary has it. Instances are safe to share
    between threads.
    """

    def __init__(
        self,
        encoder: Mapping[str, int],
        merges: Sequence[tuple[str, str]],
        *,
        special_tokens: Iterable[str] | None = None,
        vocab_source: str = "vocabulary",
        merges_source: str = "merges",
    ) -> None:
        check_vocab(encoder, vocab_source)
        check_merges(merges, encoder, merges_source)
        self._setup(dict(encoder), list(merges), special_tokens, vocab_source)

    def _setup(
        self,
        encoder: dict[str, int],
        merges: list[tuple[str, str]],
        special_tokens: Iterable[str] | None,
        vocab_source: str,
    ) -> None:
        """Build the lookup tables from validated data."""
        self._encoder = encoder
        self._num_merges = len(merges)
        self._merges = MergeTable([(encoder[a], encoder[b]) for a, b in merges], [encoder[a + b] for a, b in merges])
        self._byte_ids: list[int] = [encoder[c] for c in BYTE_TO_CHAR]
        self._decoder: list[bytes] = [b""] * len(encoder)
        for token, token_id in encoder.items():
            self._decoder[token_id] = token_to_bytes(token)
        if special_tokens is None:
            special_tokens = [EOT] if EOT in encoder else []
        self._special: dict[str, int] = {}
        for name in special_tokens:
            if name not in encoder:
                raise FormatError(f"{vocab_source}: the special token {name!r} is not in the vocabulary")
            self._special[name] = encoder[name]
            self._decoder[encoder[name]] = name.encode("utf-8")
        self._special_splitters: dict[frozenset[str], re.Pattern[str]] = {}
        self._cache = PieceCache(self._bpe, _CACHE_ENTRIES, _CACHE_PIECE_CHARS)
        self.chat_template: ChatTemplate | None = None
        """A chat template for this tokenizer's model (``load_tokenizer`` attaches the directory's), or None."""

    # -- construction ---------------------------------------------------------------

    @classmethod
    def from_bytes(
        cls,
        vocab_json: bytes,
        merges_txt: bytes,
        *,
        special_tokens: Iterable[str] | None = None,
        vocab_source: str = "vocab.json",
        merges_source: str = "merges.txt",
    ) -> BpeTokenizer:
        """Build from the contents of ``vocab.json`` and ``merges.txt``."""
        encoder = parse_vocab(vocab_json, vocab_source)  # both validated
        merges = parse_merges(merges_txt, merges_source, encoder)
        tokenizer = cls.__new__(cls)
        tokenizer._setup(encoder, merges, special_tokens, vocab_source)
        return tokenizer

    @classmethod
    def from_files(
        cls, vocab_json: StrPath, merges_txt: StrPath, *, special_tokens: Iterable[str] | None = None
    ) -> BpeTokenizer:
        """Load from a ``vocab.json`` and a ``merges.txt`` file."""
        vocab_path, merges_path = Path(vocab_json), Path(merges_txt)
        return cls.from_bytes(
            vocab_path.read_bytes(),
            merges_path.read_bytes(),
            special_tokens=special_tokens,
            vocab_source=str(vocab_path),
            merges_source=str(merges_path),
        )

    @classmethod
    def from_directory(cls, directory: StrPath, *, special_tokens: Iterable[str] | None = None) -> BpeTokenizer:
        """Load ``vocab.json`` and ``merges.txt`` from ``directory``."""
        root = Path(directory)
        return cls.from_files(root / "vocab.json", root / "merges.txt", special_tokens=special_tokens)

    # -- properties -----------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """The number of ids, special tokens included (50,257 for GPT-2)."""
        return len(self._decoder)

    @property
    def special_tokens(self) -> dict[str, int]:
        """The special tokens and their ids (a copy)."""
        return dict(self._special)

    @property
    def eot_token(self) -> int:
        """The id of ``<|endoftext|>`` (50256 for GPT-2)."""
        try:
            return self._special[EOT]
        except KeyError:
            raise KaelError(f"this vocabulary has no {EOT} token") from None

    def __repr__(self) -> str:
        return (
            f"BpeTokenizer(vocab_size={self.vocab_size}, merges={self._num_merges}, "
            f"special_tokens={sorted(self._special)})"
        )

    # -- encoding -------------------------------------------------------------------

    def encode(
        self,
        text: str,
        allowed_special: Literal["all"] | Iterable[str] = frozenset(),
    ) -> list[int]:
        """Encode ``text`` to token ids.

        Special tokens in ``text`` are encoded as plain text unless named in
        ``allowed_special`` (or it is ``"all"``); then each becomes its one id.
        Lone surrogates, which UTF-8 cannot hold, are encoded as U+FFFD.
        """
        if not isinstance(text, str):
            raise DTypeError(f"encode expects text as a str, got {type(text).__name__}")
        splitter = self._splitter(allowed_special)
        try:
            if splitter is None:
                return self._encode_ordinary(text)
            return self._encode_with_special(text, splitter)
        except UnicodeEncodeError:
            fixed = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            return self.encode(fixed, allowed_special)

    def _splitter(self, allowed_special: Literal["all"] | Iterable[str]) -> re.Pattern[str] | None:
        if isinstance(allowed_special, str):
            if allowed_special != "all":
                raise KaelError(
                    f"allowed_special must be 'all' or a set of special tokens, got the string {allowed_special!r}"
                )
            allowed = frozenset(self._special)
        else:
            allowed = frozenset(allowed_special)
        if not allowed:
            return None
        splitter = self._special_splitters.get(allowed)
        if splitter is None:
            unknown = allowed - self._special.keys()
            if unknown:
                raise KaelError(
                    f"allowed_special names {sorted(unknown)}, which are not special tokens "
                    f"of this vocabulary (those are {sorted(self._special)})"
                )
            # Longest first, so that a token that is a prefix of another loses.
            names = sorted(allowed, key=lambda s: (-len(s), s))
            splitter = re.compile("|".join(map(re.escape, names)))
            self._special_splitters[allowed] = splitter
        return splitter

    def _encode_with_special(self, text: str, splitter: re.Pattern[str]) -> list[int]:
        ids: list[int] = []
        start = 0
        for match in splitter.finditer(text):
            ids += self._encode_ordinary(text[start : match.start()])
            ids.append(self._special[match.group()])
            start = match.end()
        ids += self._encode_ordinary(text[start:])
        return ids

    def _encode_ordinary(self, text: str) -> list[int]:
        pieces = pretokenize(text)
        cache = self._cache
        parts = list(map(cache.get, pieces))  # hits, at C speed
        misses = parts.count(None)
        if misses * 8 > len(parts):
            # Mostly new text: look every piece up again; cache[piece] runs BPE on a
            # miss and caches it, so a piece repeated in this text is encoded once.
            parts = list(map(cache.__getitem__, pieces))
        elif misses:
            fresh: dict[str, tuple[int, ...]] = {}  # also dedups pieces too long to cache
            i = -1
            for _ in range(misses):
                i = parts.index(None, i + 1)
                piece = pieces[i]
                part = fresh.get(piece)
                if part is None:
                    part = fresh[piece] = cache[piece]
                parts[i] = part
        return list(chain.from_iterable(parts))  # type: ignore[arg-type]  # no None left

    def _bpe(self, piece: str) -> tuple[int, ...]:
        """BPE one pre-token (uncached)."""
        byte_ids = self._byte_ids
        return tuple(merge([byte_ids[b] for b in piece.encode("utf-8")], self._merges))

    # -- decoding -------------------------------------------------------------------

    def decode(self, ids: Iterable[int]) -> bytes:
        """The bytes that ``ids`` stand for (not necessarily valid UTF-8 on its own)."""
        if not isinstance(ids, (list, tuple)):
            ids = list(ids)
        decoder = self._decoder
        try:
            if ids and min(ids) < 0:
                raise IndexError
            return b"".join(map(decoder.__getitem__, ids))
        except (IndexError, TypeError):
            self._raise_bad_id(ids)

    def decode_text(self, ids: Iterable[int], errors: str = "replace") -> str:
        """``decode(ids)`` as text; bytes that are not UTF-8 follow ``errors`` (see ``bytes.decode``)."""
        return self.decode(ids).decode("utf-8", errors)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token."""
        return self.decode((token_id,))

    def incremental_decoder(self, errors: str = "replace") -> IncrementalDecoder:
        """A decoder that takes ids one at a time and yields only complete characters."""
        return IncrementalDecoder(self, errors)

    def _raise_bad_id(self, ids: Sequence[int]) -> NoReturn:
        n = len(self._decoder)
        for position, token_id in enumerate(ids):
            if not hasattr(token_id, "__index__"):
                raise DTypeError(f"decode: token ids must be integers, got {token_id!r} at position {position}")
            if not 0 <= token_id < n:
                raise IndexError_(
                    f"decode: token id {token_id} at position {position} is out of range "
                    f"for a vocabulary of {n} ids (valid: 0..{n - 1})"
                )
        raise AssertionError("_raise_bad_id called with valid ids")
