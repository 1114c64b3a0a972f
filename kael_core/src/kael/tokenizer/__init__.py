"""Tokenizers: GPT-2's byte-level BPE (``BpeTokenizer``), Hugging Face ``tokenizer.json``
tokenizers (``HFTokenizer``), ``load_tokenizer`` for either (``encode_chat`` for a rendered chat prompt), chat templates
(``ChatTemplate``) and the streaming ``IncrementalDecoder`` (which decodes the ids of any
tokenizer with ``decode(ids) -> bytes``: ``SupportsDecode``)."""

from __future__ import annotations

from kael.tokenizer._chat import ChatTemplate
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
]
