"""The shapes of the model, tokenizer and random-generator factory the server drives.

kael's ``GPT`` and ``BpeTokenizer`` satisfy these; tests use small fakes. Only the
members listed here are ever touched, so any object with them can be served.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["BatchEngine", "Model", "OnToken", "RngFactory", "Sampler", "Tokenizer"]

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


class BatchEngine(Protocol):
    """Decodes several sequences together, one cache row each (kael's ``models.BatchDecoder``).

    ``prefill`` runs one prompt alone into a free row and returns the logits after it;
    ``prefill_many`` does so for several prompts and rows in one call (indexable by
    position; each row's logits exactly as ``prefill`` gives them; if it raises, no row
    was started);
    ``decode`` appends one token to each of several rows in one pass and returns their
    logits in the same order (indexable by position; valid until the next call); ``sample``
    picks a token from one sequence's logits exactly as ``Model.generate`` would, and
    ``greedy`` picks every row's greedy token (``sample`` at temperature 0) from a step's
    logits in one call; ``fork(src, dst)`` starts free row ``dst`` as a copy of row ``src``'s
    sequence (the ``n`` choices of a prompt share its prefill). A row's logits convert to a
    NumPy row with ``numpy.asarray`` (for a ``kael.engine.TokenSampler``).

    KV memory (NOTE [kv memory] in batching.py): ``paged`` says whether rows share a block
    pool; ``blocks_needed(rows)`` is what the next ``decode`` of those rows takes from it and
    ``free_blocks`` what it can hand out (``block_size`` positions each); a prefill or decode
    that does not fit raises kael's ``KVCacheFull`` with nothing changed, and ``preempt(row)``
    gives a row's blocks back (its full blocks stay cached). ``cached_tokens(row)`` counts the
    prompt tokens of a row that came from the prefix cache; ``kv_stats()`` the pool's counters.
    """

    rows: int

    @property
    def paged(self) -> bool: ...

    @property
    def block_size(self) -> int: ...

    @property
    def free_blocks(self) -> int: ...

    def blocks_needed(self, rows: Sequence[int]) -> int: ...

    def preempt(self, row: int) -> None: ...

    def cached_tokens(self, row: int) -> int: ...

    def kv_stats(self) -> dict[str, int]: ...

    def prefill(self, row: int, prompt: list[int]) -> Any: ...

    def prefill_many(self, rows: list[int], prompts: list[list[int]]) -> Any: ...

    def decode(self, rows: list[int], tokens: list[int]) -> Any: ...

    def sample(self, logits: Any, temperature: float = 0.0, top_k: int = 0, generator: Any = None) -> int: ...

    def greedy(self, logits: Any) -> list[int]: ...

    def fork(self, src: int, dst: int) -> None: ...

    def release(self, row: int) -> None: ...
