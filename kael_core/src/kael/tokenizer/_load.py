"""``load_tokenizer``: the tokenizer of a checkpoint directory, whichever format it ships;
``encode_chat``: the ids of a prompt a chat template rendered.

A Hugging Face ``tokenizer.json`` (``HFTokenizer``) when the directory has one, else
GPT-2's ``vocab.json`` + ``merges.txt`` (``BpeTokenizer``, given the directory's chat
template when it has one).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kael._errors import FormatError
from kael.tokenizer._chat import ChatTemplate
from kael.tokenizer._hf import TOKENIZER_JSON, HFTokenizer
from kael.tokenizer._tokenizer import BpeTokenizer

__all__ = ["encode_chat", "load_tokenizer"]


def load_tokenizer(directory: str | os.PathLike[str]) -> BpeTokenizer | HFTokenizer:
    """Load the tokenizer in ``directory``: ``tokenizer.json``, else ``vocab.json`` + ``merges.txt``."""
    root = Path(directory)
    if not root.is_dir():
        raise FormatError(f"load_tokenizer: {str(root)!r} is not a directory")
    if (root / TOKENIZER_JSON).is_file():
        return HFTokenizer.from_directory(root)
    if (root / "vocab.json").is_file() and (root / "merges.txt").is_file():
        tokenizer = BpeTokenizer.from_directory(root)
        tokenizer.chat_template = ChatTemplate.from_directory(root)
        return tokenizer
    raise FormatError(
        f"load_tokenizer: {str(root)!r} holds no tokenizer: looked for {TOKENIZER_JSON}, or vocab.json and merges.txt"
    )


def encode_chat(tokenizer: Any, text: str) -> list[int]:
    """The ids of a prompt a chat template rendered: special tokens written in ``text`` are the
    tokenizer's specials, and a text that already starts with the BOS token gets no second one
    (as Hugging Face's ``apply_chat_template`` and vLLM avoid it); other texts are encoded as
    the tokenizer's config says (with its BOS, when it adds one). ``tokenizer`` is a
    ``BpeTokenizer``, an ``HFTokenizer``, or any tokenizer with ``encode(text, add_special_tokens=)``
    (and a ``bos_token``, when it has one)."""
    if isinstance(tokenizer, BpeTokenizer):
        return tokenizer.encode(text, allowed_special="all")
    bos = getattr(tokenizer, "bos_token", None)  # any tokenizer with encode(text, add_special_tokens=)
    if bos and text.startswith(bos):
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(text))
