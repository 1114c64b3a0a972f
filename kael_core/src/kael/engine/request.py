"""Request: one sequence the engine generates, from its prompt ids to its finish.

NOTE [request state] (vLLM v1's design): a request is its token ids (``prompt_ids`` then
``output_ids``), how many of them have keys and values in the KV cache (``num_computed``),
one ``SamplingParams`` and a status. Each step the scheduler gives a running request "n new
tokens": ``all_ids[num_computed : num_computed + n]``. A request whose ``num_computed`` is
behind its token count is prefilling (a prompt chunk, or the recomputation of a preempted
one); one that is a single token behind decodes. There is no parked or resuming state: a
preempted request goes back to WAITING with ``num_computed = 0`` and its output kept, and is
later started again like any prompt (``prompt_ids + output_ids``), whose blocks the prefix
cache mostly still holds. Its sampler and stop state are untouched, so it goes on exactly
where it stopped.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import KaelError
from .params import SamplingParams
from .stop import SequenceStop

__all__ = ["Picker", "Request", "RequestError", "RequestStatus", "check_fits"]

_ORDER = itertools.count()


class RequestError(KaelError):
    """A request the engine cannot take: its field, the offending value and what was expected."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class RequestStatus(enum.Enum):
    """Where a request is: waiting for a row, running, or finished (and why)."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        """Whether the request is done (stopped, at its length limit, or aborted)."""
        return self not in (RequestStatus.WAITING, RequestStatus.RUNNING)


Picker = Callable[[Any], int]
"""``picker(logits row) -> token``: how a request samples (None on a request: the runner's draw)."""


def _prompt(ids: Any) -> list[int]:
    try:
        out = list(ids)
    except TypeError:
        raise RequestError("prompt_ids", f"expected a sequence of token ids, got {type(ids).__name__}") from None
    if not out:
        raise RequestError("prompt_ids", "expected at least one token id, got none")
    for t in out:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise RequestError("prompt_ids", f"expected non-negative int token ids, got {t!r}")
    return out


def _check_plain_draw(params: SamplingParams, prompt: Sequence[int], eos_ids: Collection[int]) -> None:
    """A request without a sampler is drawn from temperature and top_k alone: refuse params that say
    more (a constraint, penalties, logit_bias, min_tokens, top_p, min_p, logprobs) rather than
    silently decode without them."""
    from .sampler import TokenSampler  # its processors are what a sampler would add

    if params.constraint is not None:
        raise RequestError(
            "sampler",
            "params.constraint needs a sampler that applies it (kael.engine.TokenSampler(params, tokenizer=...)); "
            "without one the request would decode unconstrained",
        )
    if not TokenSampler(params, prompt, end_tokens=eos_ids).simple:
        raise RequestError(
            "sampler",
            "these params (penalties, logit_bias, min_tokens, top_p, min_p or logprobs) need a sampler "
            "(kael.engine.TokenSampler(params, prompt_ids)); the runner's own draw uses temperature and top_k only",
        )


@dataclass(eq=False)
class Request:
    """One sequence to generate (NOTE [request state]).

    ``sampler`` picks a token from this request's logits row (a ``TokenSampler``, or any
    callable); without one the runner draws it from ``params.temperature`` and ``top_k`` with
    ``generator`` (``model.generate``'s draw), greedy at temperature 0 (one argmax call for all
    the greedy rows of a product).
    ``on_token(token) -> bool`` sees each new token and says whether to go on (a server's text
    output: stop strings, cancellation); without it the request's own ``stop`` decides.
    ``stop_state``: the ``SequenceStop`` that ``on_token`` feeds (default: this request's own,
    from ``params`` and ``eos_ids``).
    ``fork_of``: a request with the same prompt whose prefill this one shares (``n`` choices):
    it waits for that prefill, then copies its row (NOTE [forks] in scheduler.py).
    """

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    eos_ids: Collection[int] = ()
    sampler: Picker | None = None
    generator: Any = None
    on_token: Callable[[int], bool] | None = None
    stop_state: SequenceStop | None = None
    fork_of: Request | None = None
    request_id: Hashable = None
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    """Leading tokens of ``all_ids`` whose keys and values are in the cache."""
    prefill_target: int = 0
    """``num_tokens`` when it was last started: below it, the request is prefilling."""
    num_cached: int = 0
    """Prompt tokens that came from the prefix cache (or a fork) at its first start."""
    status: RequestStatus = RequestStatus.WAITING
    row: int | None = None
    """Its KV-cache row while running."""
    preemptions: int = 0
    started: bool = False
    arrival: int = field(default_factory=lambda: next(_ORDER))
    """Admission order: the newest request has the largest (preemption takes it first)."""

    def __post_init__(self) -> None:
        self.prompt_ids = _prompt(self.prompt_ids)
        if not isinstance(self.params, SamplingParams):
            raise RequestError("params", f"expected kael.engine.SamplingParams, got {type(self.params).__name__}")
        if self.sampler is None:
            _check_plain_draw(self.params, self.prompt_ids, self.eos_ids)
        if self.request_id is None:
            self.request_id = self.arrival
        if self.stop_state is None:
            self.stop_state = SequenceStop(self.params, frozenset(int(t) for t in self.eos_ids))

    @property
    def stop(self) -> SequenceStop:
        """Its stop state (the one stop function, kael.engine.stop)."""
        assert self.stop_state is not None, "set in __post_init__"
        return self.stop_state

    @property
    def all_ids(self) -> list[int]:
        """The prompt then every generated token."""
        return [*self.prompt_ids, *self.output_ids]

    @property
    def num_tokens(self) -> int:
        """Tokens known so far: prompt and output."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefilling(self) -> bool:
        """Whether its next step is a prefill chunk (not a one-token decode)."""
        return self.num_computed < self.prefill_target

    @property
    def finished(self) -> bool:
        """Whether it has finished (any reason)."""
        return self.status.finished

    @property
    def finish_reason(self) -> str | None:
        """``"stop"``, ``"length"`` or ``"abort"`` once finished; None before."""
        return self.status.value if self.status.finished else None

    def append(self, token: int) -> bool:
        """Adds a sampled token; False once the request is done (its status then says why).

        The one stop decision: ``on_token`` when given (its ``stop`` is then the caller's
        ``SequenceStop``), else this request's ``stop`` (end tokens, ``min_tokens``,
        ``ignore_eos``, ``max_tokens``)."""
        self.output_ids.append(int(token))
        more = self.on_token(token) if self.on_token is not None else self.stop.token(token) and not self.stop.stopped
        if not more:
            self.status = RequestStatus.FINISHED_STOPPED if self.stop.stopped else RequestStatus.FINISHED_ABORTED
        elif self.stop.at_length:
            self.status = RequestStatus.FINISHED_LENGTH
        return not self.finished


def check_fits(prompt: Sequence[int], params: SamplingParams, context: int) -> None:
    """The one request-level check: the prompt plus ``max_tokens`` fits the model's context."""
    if len(prompt) + params.max_tokens > context:
        raise RequestError(
            "max_tokens",
            f"the prompt ({len(prompt)} tokens) plus max_tokens ({params.max_tokens}) exceeds the context "
            f"of {context} tokens",
        )
