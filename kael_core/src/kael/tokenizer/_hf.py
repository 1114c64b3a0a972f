"""``HFTokenizer``: a Hugging Face ``tokenizer.json`` tokenizer (Llama, Qwen2, Mistral, SmolLM2, ...).

The ``tokenizers`` library runs the pipeline (normalizer, pre-tokenizer, model,
post-processor, decoder), set up as ``transformers.AutoTokenizer`` sets it up from the
directory's ``tokenizer_config.json``: the added tokens of ``added_tokens_decoder`` and
the named special tokens (bos/eos/unk/pad and the extra ones) are registered, and the
post-processor of ``tokenizer.json`` decides which tokens (BOS, EOS) ``encode`` adds: as
in ``transformers`` 5, the config's ``add_bos_token`` / ``add_eos_token`` do not override
it. So ``encode`` gives the ids ``AutoTokenizer.from_pretrained(directory)(text)["input_ids"]``
gives.

Decoding to bytes is kael's own: ``decode(ids)`` joins each token's bytes, computed from
the token string by the decoder's per-token steps (byte-level characters to bytes,
``<0xHH>`` byte-fallback tokens to their byte, ``▁`` to a space), so a character split
over several tokens comes out whole from ``IncrementalDecoder``. Positional steps (the
``Strip`` of the first token's prefix space) are left to ``decode_text``: ``decode`` is
the text the ids add after whatever came before them.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

from kael._errors import DTypeError, FormatError, IndexError_, KaelError
from kael.tokenizer._chat import ChatTemplate
from kael.tokenizer._hf_decoder import Piece, byte_level, decoder_steps
from kael.tokenizer._hfconfig import (
    SPECIAL_TOKENS_MAP,
    TOKENIZER_CONFIG,
    TokenizerConfig,
    TokenSpec,
    parse_tokenizer_config,
    read_tokenizer_config,
)
from kael.tokenizer._incremental import IncrementalDecoder

__all__ = ["HFTokenizer", "TOKENIZER_JSON"]

TOKENIZER_JSON = "tokenizer.json"
_EOT = "<|endoftext|>"

_PROBE = "Hello, world! 123 \t\n  é中🙂 <s></s>"
"""Encoded and decoded once at load, so that a file the library cannot run fails as a FormatError."""

StrPath = str | os.PathLike[str]


#: How far the largest token id may exceed twice the number of tokens (gaps are rare and small).
_SPARE_IDS = 1 << 16


class HFTokenizer:
    """A ``tokenizer.json`` tokenizer, through the Hugging Face ``tokenizers`` library.

    >>> tok = HFTokenizer.from_directory("weights/SmolLM2-135M-Instruct")  # doctest: +SKIP
    >>> tok.encode("Hello world")  # doctest: +SKIP
    [19556, 905]

    Build it with ``from_directory`` (or ``from_bytes``). Instances are safe to share
    between threads for encoding and decoding.
    """

    def __init__(self, tokenizer: Tokenizer, decoder: Any, config: TokenizerConfig, *, source: str) -> None:
        """Wrap a ``tokenizers.Tokenizer``; ``decoder`` is its ``"decoder"`` JSON, ``config`` the tokenizer config."""
        self._tk = tokenizer
        self._source = source
        self._register_tokens(config)
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self._vocab_size = max(vocab.values(), default=-1) + 1
        if self._vocab_size > 2 * len(vocab) + _SPARE_IDS:
            # Ids are dense in every real vocabulary; a stray huge id would size the id tables
            # below by it (a gigabyte for an id of 10**9).
            raise FormatError(
                f"{source}: token id {self._vocab_size - 1} is far beyond the vocabulary's {len(vocab)} "
                f"tokens; expected ids below {2 * len(vocab) + _SPARE_IDS}"
            )
        self._gaps = frozenset(range(self._vocab_size)).difference(vocab.values())  # ids with no token (rare)
        added = tokenizer.get_added_tokens_decoder()
        self._added: dict[int, str] = {i: t.content for i, t in added.items()}
        self._special: dict[str, int] = {t.content: i for i, t in sorted(added.items()) if t.special}
        self._special_ids = frozenset(self._special.values())
        self._piece_steps, self._strip_left = decoder_steps(decoder)
        self._bytes: list[bytes | None] = [None] * self._vocab_size
        named = {name: spec.content for name, spec in config.named.items()}
        self._bos = named.get("bos_token")
        self._eos = named.get("eos_token")
        self._bos_id = tokenizer.token_to_id(self._bos) if self._bos is not None else None
        self._eos_id = tokenizer.token_to_id(self._eos) if self._eos is not None else None
        self.chat_template: ChatTemplate | None = None
        """The directory's chat template (``chat_template.jinja`` or ``tokenizer_config.json``), if any."""

    # -- construction ---------------------------------------------------------------

    @classmethod
    def from_directory(cls, directory: StrPath) -> HFTokenizer:
        """Load ``tokenizer.json`` and, when present, ``tokenizer_config.json`` / ``special_tokens_map.json``
        and the chat template from ``directory``."""
        root = Path(directory)
        path = root / TOKENIZER_JSON
        if not path.is_file():
            raise FormatError(f"{root}: no {TOKENIZER_JSON} in this directory")
        try:
            data = path.read_bytes()
        except OSError as e:
            raise FormatError(f"{path}: cannot be read: {e.strerror or e}") from None
        tokenizer = cls._build(data, str(path), read_tokenizer_config(root))
        tokenizer.chat_template = ChatTemplate.from_directory(root)
        return tokenizer

    @classmethod
    def from_bytes(
        cls,
        tokenizer_json: bytes,
        tokenizer_config: bytes | None = None,
        special_tokens_map: bytes | None = None,
        *,
        source: str = TOKENIZER_JSON,
    ) -> HFTokenizer:
        """Build from the contents of ``tokenizer.json`` (and optionally the two config files).

        A ``chat_template`` in ``tokenizer_config`` becomes ``.chat_template``.
        """
        config_raw = _parse_object(tokenizer_config, TOKENIZER_CONFIG) if tokenizer_config is not None else {}
        map_raw = _parse_object(special_tokens_map, SPECIAL_TOKENS_MAP) if special_tokens_map is not None else None
        config = parse_tokenizer_config(config_raw, TOKENIZER_CONFIG, map_raw, SPECIAL_TOKENS_MAP)
        tokenizer = cls._build(tokenizer_json, source, config)
        tokenizer.chat_template = ChatTemplate.from_config_entry(
            config.chat_template,
            TOKENIZER_CONFIG,
            bos_token=tokenizer.bos_token,
            eos_token=tokenizer.eos_token,
        )
        return tokenizer

    @classmethod
    def _build(cls, data: bytes, source: str, config: TokenizerConfig) -> HFTokenizer:
        raw = _parse_object(data, source)
        if not isinstance(raw.get("model"), dict):
            raise FormatError(f"{source}: expected a 'model' object (a tokenizers serialization)")
        try:
            tokenizer = Tokenizer.from_str(data.decode("utf-8"))  # valid UTF-8: _parse_object checked
        except BaseException as e:  # the library raises Exception, or PanicException (a BaseException)
            if isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError)):
                raise
            raise FormatError(f"{source}: not a valid tokenizers file: {_first_line(e)}") from None
        try:
            built = cls(tokenizer, raw.get("decoder"), config, source=source)
            # The library checks little at load; a file it cannot run (a post-processor naming a
            # token it does not define, a byte-level vocabulary lacking bytes) fails here, not later.
            for add in (True, False):
                built.decode_text(built.encode(_PROBE, add_special_tokens=add))
            built.decode_text([])
        except KaelError:
            raise
        except BaseException as e:
            if isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError)):
                raise
            raise FormatError(f"{source}: the tokenizers library cannot run this file: {_first_line(e)}") from None
        return built

    def _register_tokens(self, config: TokenizerConfig) -> None:
        """Register the config's added tokens, then its named and extra special tokens, as ``transformers`` does."""
        tk = self._tk
        present = {t.content for t in tk.get_added_tokens_decoder().values()}
        for _, spec in sorted(config.added_tokens.items()):
            if spec.content not in present:
                (tk.add_special_tokens if spec.special else tk.add_tokens)([_added_token(spec)])
                present.add(spec.content)
        for spec in (*config.named.values(), *config.extra_special):
            if spec.content not in present:
                tk.add_special_tokens([_added_token(replace(spec, special=True))])
                present.add(spec.content)

    # -- properties -----------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """The number of ids, added tokens included (one more than the largest id)."""
        return self._vocab_size

    @property
    def special_tokens(self) -> dict[str, int]:
        """The special tokens (bos/eos/unk/pad and the added tokens marked special) and their ids (a copy)."""
        return dict(self._special)

    @property
    def bos_token(self) -> str | None:
        """The beginning-of-sequence token's text, from ``tokenizer_config.json`` (None when not given)."""
        return self._bos

    @property
    def eos_token(self) -> str | None:
        """The end-of-sequence token's text, from ``tokenizer_config.json`` (None when not given)."""
        return self._eos

    @property
    def bos_token_id(self) -> int | None:
        """The id of ``bos_token`` (None when there is none)."""
        return self._bos_id

    @property
    def eos_token_id(self) -> int | None:
        """The id of ``eos_token`` (None when there is none)."""
        return self._eos_id

    @property
    def eot_token(self) -> int:
        """The id that ends a text: ``eos_token_id``, else ``<|endoftext|>``'s id."""
        if self._eos_id is not None:
            return self._eos_id
        fallback = self._tk.token_to_id(_EOT)
        if fallback is not None:
            return fallback
        raise KaelError(
            f"{self._source}: this tokenizer has no end-of-text token: no eos_token in "
            f"{TOKENIZER_CONFIG} and no {_EOT} in the vocabulary"
        )

    def __repr__(self) -> str:
        return (
            f"HFTokenizer(vocab_size={self.vocab_size}, special_tokens={len(self._special)}, source={self._source!r})"
        )

    # -- encoding -------------------------------------------------------------------

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Encode ``text`` to ids, as ``transformers``' tokenizer does.

        With ``add_special_tokens`` the post-processor adds its tokens (BOS/EOS, as the
        config says). Special tokens written in the text become their ids. Lone
        surrogates, which UTF-8 cannot hold, are encoded as U+FFFD.
        """
        if not isinstance(text, str):
            raise DTypeError(f"encode expects text as a str, got {type(text).__name__}")
        if type(add_special_tokens) is not bool:
            raise DTypeError(f"encode: add_special_tokens must be a bool, got {add_special_tokens!r}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        try:
            ids: list[int] = self._tk.encode(text, add_special_tokens=add_special_tokens).ids
        except BaseException as e:
            raise self._library_failure(e, "encode") from None
        if ids and (max(ids) >= self._vocab_size or (self._gaps and not self._gaps.isdisjoint(ids))):
            bad = next(i for i in ids if i >= self._vocab_size or i in self._gaps)
            raise FormatError(f"{self._source}: encode gave the id {bad}, which stands for no token in this file")
        return ids

    # -- decoding -------------------------------------------------------------------

    def decode(self, ids: Iterable[int]) -> bytes:
        """The bytes that ``ids`` stand for, token by token (not necessarily valid UTF-8 on its own).

        Each token contributes the same bytes wherever it stands, so streaming the ids
        one at a time through ``IncrementalDecoder`` gives ``decode(ids)`` as text. Unlike
        ``decode_text``, the space a Metaspace tokenizer put before the first word is kept.
        """
        checked = self._check_ids(ids, "decode")
        table = self._bytes
        parts: list[bytes] = []
        for token_id in checked:
            piece = table[token_id]
            if piece is None:
                piece = table[token_id] = self._token_to_bytes(token_id)
            parts.append(piece)
        return b"".join(parts)

    def decode_text(self, ids: Iterable[int], errors: str = "replace", *, skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` as ``transformers``' ``decode`` gives it.

        With ``errors="replace"`` this is the ``tokenizers`` decoder's output (bytes that
        are not UTF-8 become U+FFFD). Any other ``errors`` decodes ``decode(ids)`` with it
        (see ``bytes.decode``), the decoder's leading strip applied; ``"strict"`` raises a
        ``KaelError`` for bytes that are not UTF-8.
        """
        checked = self._check_ids(ids, "decode_text")
        if skip_special_tokens:
            checked = [i for i in checked if i not in self._special_ids]
        if errors == "replace":
            try:
                return self._tk.decode(checked, skip_special_tokens=False)
            except BaseException as e:
                raise self._library_failure(e, "decode_text") from None
        try:
            codecs.lookup_error(errors)
        except (LookupError, TypeError):
            raise KaelError(f"decode_text: unknown errors handler {errors!r} (see bytes.decode)") from None
        try:
            text = self.decode(checked).decode("utf-8", errors)
        except UnicodeDecodeError as e:
            raise KaelError(
                f"decode_text: the ids' bytes are not UTF-8 at byte {e.start} ({e.reason}) and errors={errors!r}"
            ) from None
        if self._strip_left is not None and checked and checked[0] not in self._added:
            content, count = self._strip_left
            for _ in range(count):
                text = text.removeprefix(content)
        return text

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token."""
        return self.decode((token_id,))

    def incremental_decoder(self, errors: str = "replace") -> IncrementalDecoder:
        """A decoder that takes ids one at a time and yields only complete characters."""
        return IncrementalDecoder(self, errors)

    def _token_to_bytes(self, token_id: int) -> bytes:
        added = self._added.get(token_id)
        token = added if added is not None else self._tk.id_to_token(token_id)
        assert token is not None, "_check_ids lets only ids with a token through"
        piece: Piece = token
        for step in self._piece_steps:
            # An added token is text, not byte-level characters (the library's ByteLevel
            # decoder would turn a non-ASCII added token into stray bytes; ASCII agrees).
            if added is None or step is not byte_level:
                piece = step(piece)
        return piece if isinstance(piece, bytes) else piece.encode("utf-8")

    def _library_failure(self, e: BaseException, op: str) -> BaseException:
        """A library error (or Rust panic) as a FormatError naming the file; interrupts pass through."""
        if isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError)):
            return e
        return FormatError(f"{self._source}: {op}: the tokenizers library cannot run this file: {_first_line(e)}")

    def _check_ids(self, ids: Iterable[int], op: str) -> list[int]:
        """``ids`` as a list of ints (NumPy integers and other ``__index__`` types converted), each a token."""
        checked = ids if isinstance(ids, list) else list(ids)
        n = self._vocab_size
        if all(type(i) is int and 0 <= i < n for i in checked) and not (
            self._gaps and self._gaps.intersection(checked)
        ):
            return checked
        out: list[int] = []
        for position, token_id in enumerate(checked):
            if type(token_id) is not int:
                if isinstance(token_id, bool) or not hasattr(token_id, "__index__"):
                    raise DTypeError(f"{op}: token ids must be integers, got {token_id!r} at position {position}")
                token_id = token_id.__index__()
            if not 0 <= token_id < n:
                raise IndexError_(
                    f"{op}: token id {token_id} at position {position} is out of range "
                    f"for a vocabulary of {n} ids (valid: 0..{n - 1})"
                )
            if token_id in self._gaps:
                raise IndexError_(
                    f"{op}: token id {token_id} at position {position} stands for no token "
                    f"in this vocabulary of {n} ids (its ids are not dense)"
                )
            out.append(token_id)
        return out


def _added_token(spec: TokenSpec) -> AddedToken:
    return AddedToken(
        spec.content,
        single_word=spec.single_word,
        lstrip=spec.lstrip,
        rstrip=spec.rstrip,
        normalized=spec.normalized,
        special=spec.special,
    )


def _parse_object(data: bytes, source: str) -> dict[str, Any]:
    try:
        parsed = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise FormatError(f"{source}: not valid UTF-8 at byte {e.start}: {e.reason}") from None
    except json.JSONDecodeError as e:
        raise FormatError(f"{source}: not valid JSON: {e}") from None
    except RecursionError:
        raise FormatError(f"{source}: not valid JSON: nested too deeply") from None
    if not isinstance(parsed, dict):
        raise FormatError(f"{source}: expected a JSON object, got {type(parsed).__name__}")
    return parsed


def _first_line(e: BaseException, limit: int = 200) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
