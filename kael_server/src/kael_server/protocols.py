"""The shapes of the model, tokenizer and random-generator factory the server drives.

kael's ``GPT`` and ``BpeTokenizer`` satisfy these; tests use small fakes. Only the
members listed here are ever touched, so any object with them can be served.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

OnToken = Callable[[int], object]
"""Called by ``Model.generate`` after each new token; a falsy return stops generation."""

RngFactory = Callable[[int], object]
"""Builds the ``generator`` argument of ``Model.generate`` from a seed (e.g. a seeded ``kael.Generator``)."""


class Tokenizer(Protocol):
    vocab_size: int
    eot_token: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> bytes: ...


class Model(Protocol):
    max_positions: int
    vocab_size: int

    def generate(
        self,
        prompt: list[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int = 0,
        on_token: OnToken | None = None,
        generator: object | None = None,
    ) -> list[int]: ...
