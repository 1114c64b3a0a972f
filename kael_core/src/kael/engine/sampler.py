"""The one sampler: each sequence's ``TokenSampler`` and ``sample_rows`` over a batch of rows.

NOTE [sampling order]: one step of one sequence, in vLLM's order and with OpenAI's and vLLM's
formulas:

1. logprobs, when asked, are the model's own: ``log_softmax`` of the raw logits, before
   anything the request changes (vLLM's default, "raw logprobs");
2. the logits processors run in turn (NOTE [logits processors]): kael's own first, built from
   ``SamplingParams`` (``logit_bias``; the repetition, frequency and presence penalties;
   ``min_tokens``, masking the end tokens), then the constraint's grammar mask
   (``params.constraint``: a ``kael.constraints.ConstraintMatcher``), then the request's own;
3. temperature 0 is greedy: the argmax of these logits (the first on ties). Otherwise the
   logits are divided by the temperature, top-k, top-p and min-p drop tokens (NOTE [one top-k
   rule] in distributions.py), and one uniform number from the sequence's generator picks a
   token by the inverse CDF of the float64 softmax.

Fast paths are flags, not other samplers: a batch whose rows are all greedy with no processor
and no logprobs is one argmax on the device (the bits of the host argmax, first on ties); any
other batch is copied to the host once and each row takes the steps above.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import DTypeError, KaelError, ShapeError
from .._tensor import Tensor
from ..ops import Generator, argmax
from .distributions import draw, filter_row, log_softmax, row, softmax, top_logprobs
from .logits_processors import LogitBias, LogitsProcessor, MinTokens, Penalties
from .params import SamplingParams

__all__ = ["TokenLogprob", "TokenSampler", "pick", "sample_rows"]


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability under the model and the ``top`` most likely tokens of that step."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    """(token id, log-probability), most likely first (ties: the lower id first)."""


def pick(x: np.ndarray, params: SamplingParams, generator: Generator | None, op: str = "sample") -> int:
    """Step 3 of NOTE [sampling order] on processed float64 logits ``x`` [V]: the argmax when
    greedy, else a draw from the filtered softmax with one uniform number from ``generator``."""
    if params.greedy:
        token = int(np.argmax(x))
        if not x[token] > -np.inf:  # every logit -inf, or a NaN (which argmax picks)
            raise KaelError(f"{op}: the logits give no valid token (max logit {float(x[token])!r})")
        return token
    filtered = filter_row(x, params.temperature, params.top_k, params.top_p, params.min_p)
    return draw(softmax(filtered), generator, op)


class TokenSampler:
    """One sequence's sampler (NOTE [sampling order]); also ``generate``'s ``Sampler``.

    ``sampler(logits, tokens=None)`` takes one step's logits [V] (a Tensor or an array), picks
    the next token and accepts it (``pick_row`` then ``accept``), so it is called once per step
    with the token the sequence continues with. ``prompt`` counts for the repetition penalty
    only; ``end_tokens`` (the model's end-of-text ids) are masked with ``params.stop_token_ids``
    until ``min_tokens`` (not with ``ignore_eos``). ``processors`` are the request's own logits
    processors, run after kael's. ``last`` is the latest step's ``TokenLogprob`` when
    ``params.logprobs`` is not None. ``fork`` copies it for another sequence of the same prompt
    (n > 1); ``rollback`` forgets rejected tokens.

    With ``params.constraint`` the sampler builds its ``ConstraintMatcher`` (``matcher``) over
    ``tokenizer`` (required then), ending at ``end_tokens`` and ``params.stop_token_ids``: a
    constrained sampler is never ``simple`` nor ``plain`` (its mask is a processor).

    >>> sampler = TokenSampler(SamplingParams(temperature=0.7, top_p=0.9), prompt=ids, generator=g)  # doctest: +SKIP
    >>> model.generate(ids, 20, sampler=sampler)  # doctest: +SKIP
    """

    def __init__(
        self,
        params: SamplingParams,
        prompt: Sequence[int] = (),
        generator: Generator | None = None,
        *,
        end_tokens: Collection[int] = (),
        processors: Sequence[LogitsProcessor] = (),
        tokenizer: Any = None,
    ) -> None:
        if not isinstance(params, SamplingParams):
            raise DTypeError(f"TokenSampler: params must be SamplingParams, got {type(params).__name__}")
        if generator is not None and not isinstance(generator, Generator):
            raise DTypeError(
                f"TokenSampler: generator must be a kael.Generator or None, got {type(generator).__name__}"
            )
        for p in processors:
            if not isinstance(p, LogitsProcessor):
                raise DTypeError(
                    f"TokenSampler: {type(p).__name__} is not a LogitsProcessor (apply/accept/fork/rollback)"
                )
        self.params = params
        self.generator = generator
        self.output: list[int] = []
        """The tokens accepted so far."""
        self.last: TokenLogprob | None = None
        own = _own_processors(params, prompt, end_tokens)
        self.matcher: Any = _matcher(params, end_tokens, tokenizer)
        """The ``kael.constraints.ConstraintMatcher`` of ``params.constraint`` (None without one)."""
        mask = [self.matcher] if self.matcher is not None else []
        self.processors: list[LogitsProcessor] = [*own, *mask, *processors]
        self._v = 0  # the vocabulary size, from the first step

    @property
    def generated(self) -> int:
        """Tokens accepted so far."""
        return len(self.output)

    @property
    def plain(self) -> bool:
        """Greedy with no processor and no logprobs: the device's argmax is its whole step."""
        return self.params.greedy and not self.processors and self.params.logprobs is None

    @property
    def simple(self) -> bool:
        """No processor, no logprobs, no top-p or min-p: temperature and top_k (and the generator)
        say everything, so ``sample_next`` draws exactly what this sampler would."""
        p = self.params
        return not self.processors and p.logprobs is None and p.top_p == 1 and p.min_p == 0

    def pick_row(self, x: np.ndarray) -> int:
        """The next token from this step's float64 logits ``x`` [V] (changed in place); not yet accepted."""
        v = x.shape[0]
        if self._v != v:
            if self._v:
                raise ShapeError(f"TokenSampler: a step of {v} logits after steps of {self._v}")
            self._v = v
        raw = log_softmax(x) if self.params.logprobs is not None else None
        for p in self.processors:
            out = p.apply(x, self.output)
            if out is not None:
                if out.shape != x.shape:
                    raise ShapeError(
                        f"TokenSampler: {type(p).__name__}.apply returned {list(out.shape)} for {list(x.shape)}"
                    )
                x = np.asarray(out, dtype=np.float64)
        token = pick(x, self.params, self.generator, "TokenSampler")
        if raw is not None:
            self.last = TokenLogprob(token, float(raw[token]), top_logprobs(raw, self.params.logprobs or 0))
        return token

    def accept(self, token: int) -> None:
        """The sequence continues with ``token``: its processors and penalties count it."""
        self.output.append(int(token))
        for p in self.processors:
            p.accept(int(token))

    def __call__(self, logits: Tensor | np.ndarray, tokens: Sequence[int] | None = None) -> int:
        token = self.pick_row(row(logits, "TokenSampler"))
        self.accept(token)
        return token

    def fork(self, generator: Generator | None = None) -> TokenSampler:
        """A copy for another sequence of the same prompt: same tokens so far, forked processors,
        its own ``generator``."""
        twin = object.__new__(TokenSampler)
        twin.params, twin.generator, twin.last = self.params, generator, self.last
        twin.output, twin._v = list(self.output), self._v
        twin.processors = [p.fork() for p in self.processors]
        twin.matcher = None
        if self.matcher is not None:  # the twin's matcher is its fork, where the original's sits
            twin.matcher = twin.processors[self.processors.index(self.matcher)]
        return twin

    def rollback(self, n_tokens: int) -> None:
        """Forget the last ``n_tokens`` accepted tokens (rejected draft tokens)."""
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or not 0 <= n_tokens <= len(self.output):
            raise KaelError(
                f"TokenSampler.rollback: n_tokens must be an int in 0..{len(self.output)}, got {n_tokens!r}"
            )
        if n_tokens:
            del self.output[-n_tokens:]
            for p in self.processors:
                p.rollback(n_tokens)


def _own_processors(
    params: SamplingParams, prompt: Sequence[int], end_tokens: Collection[int]
) -> list[LogitsProcessor]:
    out: list[LogitsProcessor] = []
    if params.logit_bias:
        out.append(LogitBias(params.logit_bias))
    if params.penalized:
        ids = [_token(t) for t in prompt] if params.repetition_penalty != 1 else []
        out.append(Penalties(ids, params.presence_penalty, params.frequency_penalty, params.repetition_penalty))
    ends = set(params.stop_token_ids) | (set() if params.ignore_eos else {_token(t) for t in end_tokens})
    if params.min_tokens and ends:
        out.append(MinTokens(params.min_tokens, ends))
    return out


def _matcher(params: SamplingParams, end_tokens: Collection[int], tokenizer: Any) -> Any:
    """The constraint's matcher, ending at the end tokens and ``stop_token_ids`` (None without one)."""
    if params.constraint is None:
        return None
    if tokenizer is None:
        raise KaelError(
            f"TokenSampler: a constraint ({params.constraint.field}) needs the tokenizer its grammar is "
            "compiled against: pass tokenizer="
        )
    ends = sorted({_token(t) for t in end_tokens} | set(params.stop_token_ids))
    if not ends:
        raise KaelError(
            f"TokenSampler: a constraint ({params.constraint.field}) needs an end token to finish on; "
            "pass end_tokens= or params.stop_token_ids"
        )
    from ..constraints import ConstraintMatcher  # needs the optional llguidance

    return ConstraintMatcher(params.constraint, tokenizer, ends)


def _token(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 0:
        raise KaelError(f"TokenSampler: a prompt or end token must be a token id (an int >= 0), got {value!r}")
    return int(value)


def sample_rows(logits: Tensor | np.ndarray, samplers: Sequence[TokenSampler]) -> list[int]:
    """One token per row of a step's logits [B, V], row ``i`` by ``samplers[i]``, each accepted.

    All rows plain (greedy, no processor, no logprobs): one argmax over the batch; otherwise
    one host copy of the logits and NOTE [sampling order] per row.
    """
    shape = list(getattr(logits, "shape", ()))
    if len(shape) != 2 or shape[1] == 0 or shape[0] != len(samplers):
        raise ShapeError(
            f"sample_rows: logits must be [B, V] with V >= 1 and one sampler per row, got {shape} and {len(samplers)} samplers"
        )
    if isinstance(logits, Tensor) and all(s.plain for s in samplers):
        tokens = [int(t) for t in argmax(logits, 1).tolist()]
    else:
        host = np.asarray(logits)
        tokens = [s.pick_row(np.array(host[i], dtype=np.float64)) for i, s in enumerate(samplers)]
    for s, t in zip(samplers, tokens, strict=True):
        s.accept(t)
    return tokens
