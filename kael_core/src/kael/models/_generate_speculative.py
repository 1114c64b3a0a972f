"""``generate(..., speculative=...)``: one sequence decoded by kael's engine with speculation.

``speculative`` is ``"ngram"`` (prompt lookup: ``kael.engine.NgramProposer``), a
``kael.engine.Proposer`` (a ``DraftModelProposer`` over a smaller model, ...) or a ready
``kael.engine.Speculator``. The tokens are those ``generate`` gives without it, greedy and
seeded alike (NOTE [speculation identical to plain decoding] in kael.engine.speculative): the
engine samples each verified position as plain decoding samples one step after another, with the
same ``temperature``, ``top_k`` and ``generator``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._errors import KaelError

if TYPE_CHECKING:
    from ._protocol import CausalLM

__all__ = ["speculative_generate", "speculator_of"]


def speculator_of(speculative: Any) -> Any:
    """The ``kael.engine.Speculator`` that ``speculative`` names (KaelError naming the choices otherwise)."""
    from ..engine import NgramProposer, Proposer, Speculator

    if isinstance(speculative, Speculator):
        return speculative
    if speculative == "ngram":
        return Speculator(NgramProposer())
    if isinstance(speculative, Proposer):
        return Speculator(speculative)
    raise KaelError(
        f"generate: speculative must be 'ngram', a kael.engine.Proposer or a kael.engine.Speculator, "
        f"got {speculative!r}"
    )


def speculative_generate(
    model: CausalLM,
    ids: list[int],
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    on_token: Callable[[int], Any] | None,
    generator: Any,
    speculative: Any,
    *,
    sampler: Any = None,
) -> list[int]:
    """``generate``'s tokens for ``ids`` through ``EngineCore`` over a one-row ``BatchDecoder``
    with ``speculative``'s drafts; the prompt and new tokens must fit the model's context (plain
    ``generate`` slides a window past it, which verification cannot). ``sampler`` (a
    ``TokenSampler``) samples the request instead of ``temperature``, ``top_k`` and ``generator``."""
    from ..engine import EngineCore, Request, SamplingParams
    from ._batched import BatchDecoder

    speculator = speculator_of(speculative)
    if len(ids) + max_new_tokens > model.max_positions:
        raise KaelError(
            f"generate: with speculative, the prompt ({len(ids)} tokens) and max_new_tokens ({max_new_tokens}) "
            f"must fit the model's context of {model.max_positions} positions"
        )
    params = SamplingParams(temperature=temperature, top_k=top_k) if sampler is None else sampler.params
    params = dataclasses.replace(params, max_tokens=max_new_tokens, ignore_eos=True)
    core = EngineCore.on(BatchDecoder(model, rows=1), speculator=speculator)
    request = Request(ids, params, generator=generator, sampler=sampler)
    if on_token is not None:
        request.on_token = _OnToken(request, on_token)
    core.add(request)
    while core.has_unfinished:
        for event in core.step():
            if event.error is not None:
                raise event.error
    return list(request.output_ids)


class _OnToken:
    """``generate``'s ``on_token`` contract (None or truthy goes on, falsy stops after that
    token) on top of the request's own stop rules (its ``max_tokens``)."""

    def __init__(self, request: Any, callback: Callable[[int], Any]) -> None:
        self.stop = request.stop
        self.callback = callback

    def __call__(self, token: int) -> bool:
        more = self.stop.token(token) and not self.stop.stopped
        answer = self.callback(token)
        return bool(more) and (answer is None or bool(answer))
