"""The shapes of the model, tokenizer and random-generator factory the server drives.

kael's ``GPT`` and ``BpeTokenizer`` satisfy these; tests use small fakes. Only the
members listed here are ever touched, so any object with them can be served.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol

from kael.engine import KVBackend, Runner
from kael.models import GenerationConfig

__all__ = ["BatchEngine", "ChatTemplate", "Model", "OnToken", "RngFactory", "Sampler", "ServedModel", "Tokenizer"]

OnToken = Callable[[int], object]
"""Called by ``Model.generate`` after each new token; a falsy return stops generation."""

RngFactory = Callable[[int], object]
"""Builds the ``generator`` argument of ``Model.generate`` from a seed (e.g. a seeded ``kael.Generator``)."""

Sampler = Callable[[Any, list[int]], int]
"""``sampler(logits [V], tokens so far) -> token``: replaces the model's own sampling step."""


class ChatTemplate(Protocol):
    """A chat template as the server uses it (kael's ``kael.tokenizer.ChatTemplate``)."""

    @property
    def name(self) -> str:
        """What errors call the template (its file)."""
        ...

    @property
    def source(self) -> str:
        """Its Jinja source (the tool-call format is read from it)."""
        ...

    def render(self, messages: Any, *, add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The prompt text of a conversation."""
        ...

    def end_of_turn_tokens(self, tokenizer: Any) -> tuple[int, ...]:
        """The ids that end an assistant turn under this template."""
        ...


class Tokenizer(Protocol):
    """kael's ``BpeTokenizer`` or ``HFTokenizer`` (``kael.tokenizer.load_tokenizer``). A chat
    prompt is encoded with ``encode(text, allowed_special="all")`` by a BpeTokenizer and
    ``encode(text, add_special_tokens=...)`` by any other (``kael.tokenizer.encode_chat``).
    ``chat_template`` is None for a vocabulary without one (then /v1/chat/completions says so)."""

    chat_template: ChatTemplate | None

    @property
    def vocab_size(self) -> int: ...

    @property
    def eot_token(self) -> int: ...

    @property
    def special_tokens(self) -> dict[str, int]: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> bytes: ...


class Model(Protocol):
    """A causal LM (kael's ``models.CausalLM``). ``sampler`` is passed to ``generate`` only for
    requests that need it (``SamplingParams.plain`` is false), and the model is called as
    ``model(ids)`` (ids a kael tensor [1, T], logits [1, T, V]) only for echoed prompts'
    logprobs (``kael.models.prompt_logprobs``), so a model without them serves the rest."""

    max_positions: int
    vocab_size: int
    generation_config: GenerationConfig | None
    """The checkpoint's generation_config.json (its eos ids end a text), None without one."""
    weights_scheme: str | None
    """The weights' format (``"q8_0"``, ...; None for float32), reported by ``GET /v1/models``."""

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
