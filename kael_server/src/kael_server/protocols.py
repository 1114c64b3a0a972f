"""The shapes of the model, tokenizer and random-generator factory the server drives.

kael's ``GPT`` and ``BpeTokenizer`` satisfy these; tests use small fakes. Only the
members listed here are ever touched, so any object with them can be served.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol

from kael.engine import KVBackend, Runner

__all__ = ["BatchEngine", "Model", "OnToken", "RngFactory", "Sampler", "ServedModel", "Tokenizer"]

OnToken = Callable[[int], object]
"""Called by ``Model.generate`` after each new token; a falsy return stops generation."""

RngFactory = Callable[[int], object]
"""Builds the ``generator`` argument of ``Model.generate`` from a seed (e.g. a seeded ``kael.Generator``)."""

Sampler = Callable[[Any, list[int]], int]
"""``sampler(logits [V], tokens so far) -> token``: replaces the model's own sampling step."""


class Tokenizer(Protocol):
    """kael's ``BpeTokenizer`` or ``HFTokenizer`` (``kael.tokenizer.load_tokenizer``). A chat
    prompt is encoded with ``encode(text, allowed_special="all")`` by a BpeTokenizer and
    ``encode(text, add_special_tokens=...)`` by any other (``kael.tokenizer.encode_chat``)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eot_token(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> bytes: ...


class Model(Protocol):
    """A causal LM (kael's ``models.CausalLM``). ``sampler`` is passed to ``generate`` only for
    requests that need it (``SamplingParams.plain`` is false), and the model is called as
    ``model(ids)`` (ids a kael tensor [1, T], logits [1, T, V]) only for echoed prompts'
    logprobs (``kael.models.prompt_logprobs``), so a model without them serves the rest."""

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
        *,
        sampler: Sampler | None = None,
    ) -> list[int]: ...


class BatchEngine(KVBackend, Runner, Protocol):
    """A stand-in for kael's ``BatchDecoder`` under the batch scheduler: one object that is both
    the engine's KV manager (``kael.engine.KVBackend``: rows and blocks for requests) and its
    runner (``kael.engine.Runner``: a plan's forward pass and token picks). Test engines are;
    kael's ``BatchDecoder`` is driven through ``kael.engine.KVManager`` and ``ModelRunner``."""


class ServedModel(ABC):
    """A model not from kael that brings its own engine (test models): a Generator built without
    a scheduler serves it through ``engine(rows)``, a BatchEngine of ``rows`` rows. kael's models
    are served through ``kael.models.BatchDecoder``."""

    @abstractmethod
    def engine(self, rows: int) -> BatchEngine:
        """Its engine, with ``rows`` rows (the widest request's sequences)."""
