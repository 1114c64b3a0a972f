"""GPT-2's byte-level BPE tokenizer: ``BpeTokenizer`` and its streaming ``IncrementalDecoder``
(which decodes the ids of any tokenizer with ``decode(ids) -> bytes``: ``SupportsDecode``)."""

from __future__ import annotations

from kael.tokenizer._incremental import IncrementalDecoder, SupportsDecode
from kael.tokenizer._tokenizer import BpeTokenizer

__all__ = ["BpeTokenizer", "IncrementalDecoder", "SupportsDecode"]
