"""Detokenizer: one sequence's text as its tokens arrive, cut by its stop function.

Each accepted token's bytes go through an incremental UTF-8 decoder (only whole characters
come out; a character split across tokens waits for its last byte), the model's end ids that
``ignore_eos`` lets through show no text (as vLLM skips special tokens), and the sequence's
``SequenceStop`` holds back what may be the start of a stop string and cuts the text at one
(counting from ``min_tokens`` on). ``chars`` counts the characters decoded so far, before any
cut: where the next token's text starts (a logprobs answer's ``text_offset``).
"""

from __future__ import annotations

from typing import Protocol

from ..tokenizer import IncrementalDecoder
from .stop import SequenceStop

__all__ = ["Detokenizer"]


class _Decodes(Protocol):
    def decode(self, ids: list[int]) -> bytes: ...


class Detokenizer:
    """The text of one sequence: ``token(id)`` after its ``stop.token(id)`` accepted it returns
    the text safe to send now; ``flush()`` at the end returns the rest.

    >>> stop = SequenceStop(SamplingParams(stop=("\\n",)), eos_ids=[tok.eot_token])  # doctest: +SKIP
    >>> text = Detokenizer(tok, stop)                                                # doctest: +SKIP
    >>> "".join(text.token(t) for t in ids if stop.token(t)) + text.flush()          # doctest: +SKIP
    """

    def __init__(self, tokenizer: _Decodes, stop: SequenceStop) -> None:
        self.stop = stop
        self.decoder = IncrementalDecoder(tokenizer)
        self.chars = 0
        """Characters decoded so far (before stop strings cut anything)."""

    def token(self, token: int) -> str:
        """The text that ``token`` (accepted by ``stop.token``) lets out now."""
        text = "" if self.stop.silent(token) else self.decoder.add(token)
        self.chars += len(text)
        return self.stop.text(text)

    def flush(self) -> str:
        """The sequence ended: the characters still held (incomplete bytes as U+FFFD) and the
        text held back as a possible stop string, unless a stop string cut it."""
        return self.stop.flush(self.decoder.flush())
