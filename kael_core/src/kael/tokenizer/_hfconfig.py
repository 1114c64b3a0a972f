"""Reading a Hugging Face tokenizer directory's JSON files: ``tokenizer_config.json`` and
``special_tokens_map.json``.

``read_tokenizer_config(directory)`` gathers what kael uses from them into a
``TokenizerConfig``: the named special tokens (bos/eos/unk/pad), the extra special
tokens, the added tokens of ``added_tokens_decoder`` and the raw ``chat_template``
entry (``add_bos_token`` / ``add_eos_token`` are not read: with a ``tokenizer.json``,
its post-processor decides, as in ``transformers`` 5). The files are merged as
``transformers`` merges them: ``special_tokens_map.json`` is the legacy source, read
only when ``tokenizer_config.json`` has no ``added_tokens_decoder``, and then its values
win. Every rule a file breaks is a ``FormatError`` naming the file and the rule.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kael._errors import FormatError

__all__ = [
    "TOKENIZER_CONFIG",
    "SPECIAL_TOKENS_MAP",
    "TokenSpec",
    "TokenizerConfig",
    "parse_tokenizer_config",
    "read_json_object",
    "read_tokenizer_config",
    "token_spec",
]

TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"

NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")
"""The named special tokens kael reads (``transformers``' ``SPECIAL_TOKENS_ATTRIBUTES`` that a causal LM uses)."""

_EXTRA_KEYS = ("additional_special_tokens", "extra_special_tokens")
_FLAGS = ("lstrip", "rstrip", "normalized", "single_word", "special")


@dataclass(frozen=True)
class TokenSpec:
    """One token as a config file spells it: a string, or an ``AddedToken`` object."""

    content: str
    lstrip: bool = False
    rstrip: bool = False
    normalized: bool = False
    single_word: bool = False
    special: bool = True


@dataclass
class TokenizerConfig:
    """What kael reads from ``tokenizer_config.json`` and ``special_tokens_map.json``."""

    named: dict[str, TokenSpec] = field(default_factory=dict)
    """``bos_token``, ``eos_token``, ``unk_token``, ``pad_token`` when given (not null)."""
    extra_special: list[TokenSpec] = field(default_factory=list)
    added_tokens: dict[int, TokenSpec] = field(default_factory=dict)
    """``added_tokens_decoder``: id -> token."""
    chat_template: Any = None
    """The raw ``chat_template`` entry (a string, a list of ``{"name", "template"}``, or None)."""


def read_json_object(path: Path) -> dict[str, Any]:
    """Parse the JSON object in the file ``path``; FormatError naming the file otherwise."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise FormatError(f"{path}: cannot be read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(f"{path}: not valid UTF-8 at byte {e.start}: {e.reason}") from None
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise FormatError(f"{path}: not valid JSON: {e}") from None
    except RecursionError:
        raise FormatError(f"{path}: not valid JSON: nested too deeply") from None
    if not isinstance(parsed, dict):
        raise FormatError(f"{path}: expected a JSON object, got {type(parsed).__name__}")
    return parsed


def token_spec(value: object, source: str, what: str, *, special: bool = True) -> TokenSpec:
    """A token given as a string or an ``AddedToken`` dict (``{"content": ..., "lstrip": ...}``)."""
    if isinstance(value, str):
        if not value:
            raise FormatError(f"{source}: {what} must not be the empty string")
        return TokenSpec(value, special=special)
    if not isinstance(value, dict):
        raise FormatError(f"{source}: {what} must be a string or an AddedToken object, got {_kind(value)}")
    content = value.get("content")
    if not isinstance(content, str) or not content:
        raise FormatError(f"{source}: {what} needs a non-empty string 'content', got {_short(content)}")
    flags: dict[str, bool] = {}
    for name in _FLAGS:
        if name in value:
            flag = value[name]
            if type(flag) is not bool:
                raise FormatError(f"{source}: {what}.{name} must be true or false, got {_short(flag)}")
            flags[name] = flag
    flags.setdefault("special", special)
    return TokenSpec(content, **flags)


def read_tokenizer_config(directory: str | os.PathLike[str]) -> TokenizerConfig:
    """Read ``tokenizer_config.json`` and ``special_tokens_map.json`` from ``directory`` (each optional)."""
    root = Path(directory)
    config_path, map_path = root / TOKENIZER_CONFIG, root / SPECIAL_TOKENS_MAP
    raw = read_json_object(config_path) if config_path.is_file() else {}
    special_map = read_json_object(map_path) if map_path.is_file() else None
    return parse_tokenizer_config(raw, str(config_path), special_map, str(map_path))


def parse_tokenizer_config(
    raw: dict[str, Any],
    source: str = TOKENIZER_CONFIG,
    special_map: dict[str, Any] | None = None,
    map_source: str = SPECIAL_TOKENS_MAP,
) -> TokenizerConfig:
    """Gather a ``TokenizerConfig`` from the parsed files (``source``/``map_source`` name them in errors)."""
    config = TokenizerConfig()
    _read_tokens(raw, source, config)
    decoder = raw.get("added_tokens_decoder")
    if decoder is not None:
        if not isinstance(decoder, dict):
            raise FormatError(f"{source}: added_tokens_decoder must be an object of id -> token, got {_kind(decoder)}")
        for key, value in decoder.items():
            try:
                token_id = int(key)
            except ValueError:
                raise FormatError(
                    f"{source}: added_tokens_decoder keys must be integer ids, got {_short(key)}"
                ) from None
            if token_id < 0:
                raise FormatError(f"{source}: added_tokens_decoder ids must be >= 0, got {token_id}")
            config.added_tokens[token_id] = token_spec(
                value, source, f"added_tokens_decoder[{_short(key)}]", special=False
            )
    elif special_map is not None:  # legacy: read only without added_tokens_decoder, and then it wins
        _read_tokens(special_map, map_source, config)
    config.chat_template = raw.get("chat_template")
    return config


def _read_tokens(raw: dict[str, Any], source: str, config: TokenizerConfig) -> None:
    for name in NAMED_TOKENS:
        if name in raw:
            value = raw[name]
            if value is None:
                config.named.pop(name, None)
            else:
                config.named[name] = token_spec(value, source, name)
    for key in _EXTRA_KEYS:
        values = raw.get(key)
        if values is None:
            continue
        if isinstance(values, dict):  # model-specific names -> tokens
            values = list(values.values())
        if not isinstance(values, list):
            raise FormatError(f"{source}: {key} must be a list of tokens, got {_kind(values)}")
        for index, value in enumerate(values):
            spec = token_spec(value, source, f"{key}[{index}]")
            if spec.content not in {s.content for s in config.extra_special}:
                config.extra_special.append(spec)


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _short(value: object, limit: int = 60) -> str:
    """``repr`` of a value, cut to ``limit`` characters (never echo a whole file)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
