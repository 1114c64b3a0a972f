"""llguidance glue: the tokenizer adapter (kael's vocabulary as byte strings per token id,
special tokens marked so grammar text never matches them, the end-of-text id) and the compile
cache keyed by (grammar text, tokenizer identity)."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Protocol

import llguidance

from ._spec import Constraint, ConstraintError

__all__ = ["SupportsVocabulary", "compile_constraint", "ll_tokenizer"]

_CACHE_SIZE = 64


class SupportsVocabulary(Protocol):
    """What the adapter reads from a kael tokenizer (``BpeTokenizer``, ``HFTokenizer``)."""

    @property
    def vocab_size(self) -> int:
        """Number of token ids."""
        ...

    def decode(self, ids: list[int]) -> bytes:
        """The bytes of ``ids``."""
        ...


class _Entry:
    def __init__(self, tok: llguidance.LLTokenizer) -> None:
        self.tok = tok
        self.matchers: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()


_entries: weakref.WeakKeyDictionary[Any, dict[tuple[int, ...], _Entry]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _token_bytes(tokenizer: Any, i: int) -> bytes:
    tb = getattr(tokenizer, "token_bytes", None)
    return bytes(tb(i)) if tb is not None else bytes(tokenizer.decode([i]))


def ll_tokenizer(tokenizer: SupportsVocabulary, eos: int | list[int]) -> llguidance.LLTokenizer:
    """An ``LLTokenizer`` over ``tokenizer``'s vocabulary; ``eos``: the id(s) that end a
    constrained sequence (allowed once the grammar accepts)."""
    n = tokenizer.vocab_size
    special = set(getattr(tokenizer, "special_tokens", {}).values())
    eos_ids = [eos] if isinstance(eos, int) else list(eos)
    special.update(eos_ids)
    tokens = []
    for i in range(n):
        b = _token_bytes(tokenizer, i)
        tokens.append(b"\xff" + b if i in special else b)

    class _Wrapped:
        eos_token_id = eos_ids[0]
        bos_token_id = None
        special_token_ids = sorted(special)

        def __init__(self) -> None:
            self.tokens = tokens

        def __call__(self, s: bytes | str) -> list[int]:
            return list(tokenizer.encode(s.decode("utf-8", "replace") if isinstance(s, bytes) else s))  # type: ignore[attr-defined]

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrapped()), n_vocab=n, eos_token=eos_ids)


def _entry(tokenizer: SupportsVocabulary, eos: tuple[int, ...]) -> _Entry:
    with _lock:
        per = _entries.setdefault(tokenizer, {})
        if eos not in per:
            per[eos] = _Entry(ll_tokenizer(tokenizer, list(eos)))
        return per[eos]


def compile_constraint(
    constraint: Constraint, tokenizer: SupportsVocabulary, eos: int | list[int]
) -> tuple[llguidance.LLTokenizer, llguidance.LLMatcher, bool]:
    """A fresh matcher for ``constraint`` (a copy of the cached compiled one) and whether it
    came from the cache, or a ``ConstraintError`` naming the constraint's field and the
    compiler's reason."""
    e = _entry(tokenizer, (eos,) if isinstance(eos, int) else tuple(eos))
    with _lock:
        base = e.matchers.get(constraint.text)
        if base is not None:
            e.matchers.move_to_end(constraint.text)
            return e.tok, base.deep_copy(), True
    m = llguidance.LLMatcher(e.tok, constraint.text, log_level=0)
    if m.is_error():
        raise ConstraintError(f"{constraint.field}: invalid {constraint.kind.replace('_', ' ')}: {m.get_error()}")
    with _lock:
        e.matchers[constraint.text] = m
        while len(e.matchers) > _CACHE_SIZE:
            e.matchers.popitem(last=False)
    return e.tok, m.deep_copy(), False
