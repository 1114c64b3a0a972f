"""``ConstraintMatcher``: one sequence's position in a compiled constraint, as a logits
processor (NOTE [logits processors] in kael.engine): ``apply`` sets every token the grammar
does not allow to -inf, ``accept`` advances, ``fork`` copies, ``rollback`` forgets; and
``fill_bitmasks`` computing many rows' masks in one parallel call.

Constraints never fail open (DESIGN.md, "The engine"): a token the grammar rejects, or a
state in which no token is allowed, raises ``ConstraintError``; the row is never left
unmasked."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import llguidance
import llguidance.numpy as lln
import numpy as np

from ._backend import SupportsVocabulary, compile_constraint
from ._spec import Constraint, ConstraintError

__all__ = ["ConstraintMatcher", "allowed_ids", "fill_bitmasks", "mask_logits", "new_bitmask"]

_executor: llguidance.LLExecutor | None = None


def new_bitmask(rows: int, vocab_size: int) -> np.ndarray:
    """An int32 bitmask [rows, ceil(V / 32)], bit j of word i allowing token 32 i + j."""
    return lln.allocate_token_bitmask(rows, vocab_size)


def allowed_ids(bitmask_row: np.ndarray, vocab_size: int) -> np.ndarray:
    """The token ids a bitmask row allows (int64, ascending)."""
    bits = np.unpackbits(np.ascontiguousarray(bitmask_row).view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab_size]).astype(np.int64)


class ConstraintMatcher:
    """Where one sequence is in ``constraint``; a ``kael.engine.LogitsProcessor``.

    ``eos``: the end-of-sequence id(s), allowed once the output matches (and the only
    allowed tokens once the grammar can go no further). ``cache_hit`` and ``compile_seconds``
    say how it was built; ``on_mask(seconds)``, when set, is told how long each ``apply`` took
    (a server's mask-time histogram; forks keep it)."""

    def __init__(self, constraint: Constraint, tokenizer: SupportsVocabulary, eos: int | list[int]) -> None:
        self.constraint = constraint
        start = time.perf_counter()
        self._tok, self._m, self.cache_hit = compile_constraint(constraint, tokenizer, eos)
        self.compile_seconds = time.perf_counter() - start
        self.vocab_size = self._tok.vocab_size
        self.n_accepted = 0
        self._mask = new_bitmask(1, self.vocab_size)
        self.on_mask: Callable[[float], None] | None = None

    @classmethod
    def _copy(cls, other: ConstraintMatcher) -> ConstraintMatcher:
        new = cls.__new__(cls)
        new.constraint, new._tok, new.vocab_size = other.constraint, other._tok, other.vocab_size
        new._m, new.n_accepted = other._m.deep_copy(), other.n_accepted
        new._mask = new_bitmask(1, other.vocab_size)
        new.cache_hit, new.compile_seconds, new.on_mask = True, 0.0, other.on_mask
        return new

    def _fail(self, what: str) -> ConstraintError:
        return ConstraintError(f"{self.constraint.field}: {what} ({self._m.get_error() or 'no token allowed'})")

    def fill_bitmask(self, bitmask: np.ndarray, row: int = 0) -> None:
        """Write the allowed tokens into ``bitmask[row]``."""
        if self._m.is_error():
            raise self._fail("the constrained sequence is in an error state")
        lln.fill_next_token_bitmask(self._m, bitmask, row)
        if not bitmask[row].any():
            raise self._fail("no token is allowed")

    def allowed(self) -> np.ndarray:
        """The token ids allowed next."""
        self.fill_bitmask(self._mask)
        return allowed_ids(self._mask[0], self.vocab_size)

    def apply(self, logits: np.ndarray, tokens: Sequence[int] = ()) -> None:
        """Set the logits of the disallowed tokens (and of ids past the tokenizer's
        vocabulary, in a padded model row) to -inf, in place."""
        start = time.perf_counter()
        self.fill_bitmask(self._mask)
        mask_logits(logits, self._mask[0], self.vocab_size)
        if self.on_mask is not None:
            self.on_mask(time.perf_counter() - start)

    def accept(self, token: int) -> None:
        """Advance by ``token``; a token the grammar does not allow is a ConstraintError."""
        if not self._m.consume_token(int(token)):
            raise self._fail(f"token {int(token)} is not allowed here")
        self.n_accepted += 1

    def fork(self) -> ConstraintMatcher:
        """An independent copy at the same position."""
        return ConstraintMatcher._copy(self)

    def rollback(self, n_tokens: int) -> None:
        """Forget the last ``n_tokens`` accepted tokens."""
        if not 0 <= n_tokens <= self.n_accepted:
            raise ConstraintError(
                f"{self.constraint.field}: cannot roll back {n_tokens} tokens, {self.n_accepted} accepted"
            )
        if n_tokens and not self._m.rollback(n_tokens):
            raise self._fail(f"rollback of {n_tokens} tokens failed")
        self.n_accepted -= n_tokens

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (fast-forward; empty when there is a choice)."""
        return list(self._m.compute_ff_tokens())

    @property
    def is_accepting(self) -> bool:
        """Whether the output so far is a complete match (end of sequence allowed)."""
        return bool(self._m.is_accepting())

    @property
    def is_finished(self) -> bool:
        """Whether the grammar allows nothing but the end of the sequence."""
        return bool(self._m.is_stopped())


def mask_logits(logits: np.ndarray, bitmask_row: np.ndarray, vocab_size: int) -> None:
    """``logits[j] = -inf`` for every id j the bitmask row does not allow or j >= vocab_size."""
    n = min(vocab_size, logits.shape[0])
    words = np.ascontiguousarray(bitmask_row).view(np.uint8)
    allowed = np.unpackbits(words, count=n, bitorder="little").view(bool)
    logits[n:] = -math.inf
    np.copyto(logits[:n], -math.inf, where=~allowed)


def fill_bitmasks(matchers: Sequence[ConstraintMatcher], bitmask: np.ndarray) -> None:
    """Every matcher's mask into its row of ``bitmask`` [len(matchers), W], computed in
    parallel (llguidance's thread pool)."""
    global _executor
    if bitmask.shape[0] < len(matchers):
        raise ConstraintError(f"fill_bitmasks: bitmask has {bitmask.shape[0]} rows for {len(matchers)} matchers")
    for m in matchers:
        if m._m.is_error():
            raise m._fail("the constrained sequence is in an error state")
    if _executor is None:
        _executor = llguidance.LLExecutor()
    lln.fill_next_token_bitmask_par(_executor, [(m._m, i) for i, m in enumerate(matchers)], bitmask)
    for i, m in enumerate(matchers):
        if not bitmask[i].any():
            raise m._fail("no token is allowed")
