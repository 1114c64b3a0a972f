"""Tokenizers: GPT-2's byte-level BPE (``BpeTokenizer``), Hugging Face ``tokenizer.json``
tokenizers (``HFTokenizer``), ``load_tokenizer`` for either (``encode_chat`` for a rendered chat prompt), chat templates
(``ChatTemplate``), GGUF tokenizer metadata (``tokenizer_from_gguf``, ``tokenizer_to_gguf``)
and the streaming ``IncrementalDecoder`` (which decodes the ids of any tokenizer with
``decode(ids) -> bytes``: ``SupportsDecode``)."""

from __future__ import annotations

from kael.tokenizer._chat import ChatTemplate
from kael.tokenizer._gguf import tokenizer_from_gguf, tokenizer_to_gguf
from kael.tokenizer._hf import HFTokenizer
from kael.tokenizer._incremental import IncrementalDecoder, SupportsDecode
from kael.tokenizer._load import encode_chat, load_tokenizer
from kael.tokenizer._tokenizer import BpeTokenizer

__all__ = [
    "BpeTokenizer",
    "ChatTemplate",
    "HFTokenizer",
    "IncrementalDecoder",
    "SupportsDecode",
    "encode_chat",
    "load_tokenizer",
    "tokenizer_from_gguf",
    "tokenizer_to_gguf",
]
