"""The causal-LM protocol: what generation, batched decoding and the server need of a model family.

NOTE [model-family seam]: ``generate``, ``sample_next``'s callers, ``BatchDecoder``, the
CLI and ``kael_server`` depend on ``CausalLM``, never on a concrete family. A family
(GPT-2 in ``kael.models.gpt2``, a third party's) provides four pieces, each a plain
forward pass over kael ops, and the generic machinery composes them:

    x      = model.embed(ids [B, T], starts)         the residual stream [B, T, C]
    x      = model.run_layer(i, x, step)             layer i (attention reads/extends the cache step)
    logits = model.run_head(x)                       [B, T, V]

``step`` is a ``PagedStep`` (or another object with its ``starts``, ``positions`` and
``attend(layer, q, kv)``), or None for a pass without a cache. Each row's new tokens sit
at positions ``starts[b] + t``: a family with learned position embeddings adds them in
``embed``, one with rotary embeddings rotates q and k in ``run_layer``. ``new_cache``
sizes a ``PagedKVCache`` (one block per row) for the family's key/value heads.

A family may also return a ``DecodeStep`` from ``decode_step(cache)``: one new token for
each of a set of cache rows, run with no per-step allocation (GPT-2's calls the backend's
kernels directly). Returning None makes the generic machinery use the four pieces above.
``CausalLMBase`` (``_base.py``) implements ``forward``, ``run`` and ``generate`` from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .._dtype import DType
    from .._tensor import Tensor
    from ._paged_cache import PagedKVCache

__all__ = ["CausalLM", "DecodeStep", "StepLike"]


@runtime_checkable
class StepLike(Protocol):
    """One forward pass over a KV cache, as ``run_layer`` uses it (``PagedStep`` is the reference)."""

    starts: list[int]

    @property
    def positions(self) -> list[list[int]]:
        """Each row's positions of the new tokens."""
        ...

    def attend(self, layer: int, q: Tensor, kv: Tensor, window: int | None = None) -> Tensor:
        """Store the new keys/values kv [B, 2, Hkv, T, D] of ``layer`` and attend q [B, H, T, D] to the cache
        (with ``window``, a sliding-window layer: each query sees the keys of its last ``window`` positions)."""
        ...


@runtime_checkable
class DecodeStep(Protocol):
    """A family's fast decode step over one ``PagedKVCache``.

    ``step(rows, tokens)`` feeds ``tokens[i]`` to the sequence in cache row ``rows[i]`` (at
    position ``cache.lengths[rows[i]]``), writes their keys and values, and returns logits
    [len(rows), V], a view of a buffer that the next call overwrites. It does not advance
    ``cache.lengths``: the caller does, once the step succeeded. Row i's logits must not
    depend on the other rows of the step (NOTE [batched = alone] in ``_batched.py``).

    A step whose class sets ``takes_positions = True`` also takes ``step(rows, tokens, positions)``:
    a row may then repeat at consecutive positions (NOTE [entries at positions] in ``_steps.py``),
    which lets speculative decoding verify drafts inside the decode step; without it they are
    verified through ``model.run_layer``.
    """

    def __call__(self, rows: list[int], tokens: list[int]) -> Tensor: ...


@runtime_checkable
class CausalLM(Protocol):
    """A decoder-only language model that kael can generate with, batch and serve."""

    vocab_size: int
    max_positions: int
    training: bool
    weights_scheme: str | None
    """The weights' format (``"q8_0"``, ``"q4_k_m"``, ...; None for float weights)."""
    generation_config: Any
    """The checkpoint's ``GenerationConfig`` (its eos ids end a text), None without one."""

    @property
    def num_layers(self) -> int:
        """The number of transformer layers (``run_layer``'s ``i`` is in ``range(num_layers)``)."""
        ...

    @property
    def device(self) -> Any:
        """The ``kael.Device`` the parameters live on; ids and caches must be on it too."""
        ...

    @property
    def dtype(self) -> DType:
        """The floating-point dtype the model computes in: its activations', logits' and KV cache's."""
        ...

    def eval(self) -> Any:
        """Evaluation mode (``train(False)``: dropout off); returns the model."""
        ...

    def train(self, mode: bool = True) -> Any:
        """Training mode (``mode=True``) or evaluation mode on the model and its sub-modules; returns the model."""
        ...

    @property
    def kv_window(self) -> int | None:
        """The most positions back any layer's query reads (p - kv_window + 1 .. p), when every layer attends
        within a sliding window; None when some layer sees the whole context. A paged cache gives back the blocks
        behind it (NOTE [sliding-window blocks] in _paged_cache.py)."""
        ...

    def new_cache(self, batch: int = 1, max_positions: int | None = None) -> PagedKVCache:
        """A KV cache of ``batch`` rows of up to ``max_positions`` tokens (default: the context)."""
        ...

    def embed(self, ids: Tensor, starts: Sequence[int]) -> Tensor:
        """The residual stream [B, T, C] for token ids [B, T], row b's tokens at positions starts[b]..."""
        ...

    def run_layer(self, i: int, x: Tensor, step: Any) -> Tensor:
        """Layer i on x [B, T, C]; its attention reads and extends ``step``'s cache (None: no cache)."""
        ...

    def run_head(self, x: Tensor) -> Tensor:
        """The final norm and LM head: logits [B, T, V] for x [B, T, C]."""
        ...

    def decode_step(self, cache: PagedKVCache) -> DecodeStep | None:
        """A fast one-token step over ``cache``, or None to use the generic pieces."""
        ...

    def __call__(
        self,
        ids: Tensor,
        cache: PagedKVCache | None = None,
        lengths: Sequence[int] | None = None,
        *,
        last_only: bool = False,
    ) -> Tensor:
        """Logits [B, T, V] (``last_only``: [B, 1, V]) for ids [B, T], reading and extending ``cache``."""
        ...

    def generate(
        self,
        prompt: Any,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int = 0,
        on_token: Any = None,
        generator: Any = None,
        *,
        sampler: Any = None,
        constraint: Any = None,
        tokenizer: Any = None,
        speculative: Any = None,
    ) -> list[int]:
        """New token ids continuing ``prompt`` (``kael.models.generate``)."""
        ...
