"""GPT-2's byte-level BPE tokenizer: ``BpeTokenizer`` and its streaming ``IncrementalDecoder``."""

from __future__ import annotations

from kael.tokenizer._incremental import IncrementalDecoder
from kael.tokenizer._tokenizer import BpeTokenizer

__all__ = ["BpeTokenizer", "IncrementalDecoder"]
