"""Text generation: ``generate`` (prefill, KV-cached decode, sliding window) and ``sample_next``.

``generate`` drives any ``CausalLM`` (NOTE [model-family seam] in _protocol.py): the
prompt runs through the model into a one-sequence ``BatchDecoder`` (a paged KV cache with
blocks for the positions this call can reach), then each step feeds one token through the
family's decode step over it (``decode_step``: the family's fast step, or the generic one
over its modules). Only the last position's logits are ever computed. Past the context, each
step recomputes the last ``max_positions`` tokens without a cache, at positions
0..P-1: the window the reference continuations were made with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _dtype as dt
from .._errors import DTypeError, KaelError, ShapeError
from .._tensor import Tensor
from ..autograd import no_grad
from ..engine import SamplingParams, check_temperature, pick
from ..ops import Generator, argmax, select, tensor, view

if TYPE_CHECKING:
    from ._paged_cache import PagedKVCache
    from ._protocol import CausalLM

__all__ = ["generate", "sample_next", "Sampler"]

Sampler = Callable[[Tensor, list[int]], int]
"""``sampler(logits [V], tokens so far) -> next token id``: ``generate``'s replaceable sampling step."""


def _sampled(token: Any, vocab_size: int) -> int:
    if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= int(token) < vocab_size:
        raise KaelError(f"generate: the sampler returned {token!r}, expected a token id in 0..{vocab_size - 1}")
    return int(token)


def check_sampling(temperature: Any, top_k: Any, generator: Any, op: str) -> None:
    """A KaelError naming ``op`` for a bad temperature, top_k (an int >= 0) or generator."""
    check_temperature(temperature, op)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise KaelError(f"{op}: top_k must be an int >= 0 (0 disables it), got {top_k!r}")
    if generator is not None and not isinstance(generator, Generator):
        raise DTypeError(f"{op}: generator must be a kael.Generator or None, got {type(generator).__name__}")


def sample_next(logits: Tensor, temperature: float = 0.0, top_k: int = 0, generator: Generator | None = None) -> Any:
    """The next token id from logits [V] (an int), or one per row of logits [B, V] (a list).

    temperature 0 is greedy (argmax, the first on ties); otherwise the engine's sampler
    (``kael.engine.pick``) draws from the float64 softmax(logits / temperature), top-k keeping
    the logits at or above the k-th largest (NOTE [one top-k rule]), with one uniform number
    from ``generator`` (default: kael's default generator).
    """
    check_sampling(temperature, top_k, generator, "sample_next")
    if (
        not isinstance(logits, Tensor)
        or not logits.dtype.is_floating_point
        or logits.ndim not in (1, 2)
        or logits.shape[-1] == 0
    ):
        raise ShapeError(
            f"sample_next: logits must be a floating-point tensor [V] or [B, V] with V >= 1, got "
            f"{getattr(logits, 'dtype', type(logits).__name__)!r} {list(getattr(logits, 'shape', ()))}"
        )
    if logits.ndim == 2:
        return [_sample_row(select(logits, 0, r), temperature, top_k, generator) for r in range(logits.shape[0])]
    return _sample_row(logits, temperature, top_k, generator)


def _sample_row(logits: Tensor, temperature: float, top_k: int, generator: Generator | None) -> int:
    if temperature == 0:
        return int(argmax(logits).item())  # the device's argmax: the engine's greedy fast path
    params = SamplingParams(temperature=temperature, top_k=top_k)
    return pick(np.array(logits._host(), dtype=np.float64), params, generator, "sample_next")


def _prompt_ids(prompt: Any, vocab_size: int) -> list[int]:
    if isinstance(prompt, Tensor):
        if prompt.ndim != 1 or prompt.dtype.category != 1:
            raise ShapeError(
                f"generate: a prompt tensor must be 1-d of integer ids, got {prompt.dtype!r} {list(prompt.shape)}"
            )
        ids = [int(i) for i in prompt.tolist()]
    else:
        try:
            ids = list(prompt)
        except TypeError:
            raise DTypeError(
                f"generate: prompt must be a list of token ids or a 1-d tensor, got {type(prompt).__name__}"
            ) from None
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                raise DTypeError(f"generate: prompt token ids must be ints, got {i!r}")
        ids = [int(i) for i in ids]
    if not ids:
        raise KaelError("generate: the prompt is empty; give at least one token (e.g. <|endoftext|>)")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ShapeError(f"generate: token id {bad[0]} is out of range for a vocabulary of {vocab_size}")
    return ids


def generate(
    model: CausalLM,
    prompt: Any,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int = 0,
    on_token: Callable[[int], Any] | None = None,
    generator: Generator | None = None,
    *,
    sampler: Sampler | None = None,
    constraint: Any = None,
    tokenizer: Any = None,
    speculative: Any = None,
) -> list[int]:
    """Up to ``max_new_tokens`` new token ids continuing ``prompt`` (a list of ids or a 1-d tensor).

    ``on_token(token_id)`` is called after each new token: a return of None or a truthy
    value continues, a falsy one stops (that token is still returned); an exception
    propagates. Runs under no_grad with the model in eval mode (its mode is restored).

    ``sampler(logits, tokens)`` replaces ``sample_next`` when given: it receives each
    step's logits [V] (a view valid until the next step) and every token so far (prompt
    and generated, a list it must not keep) and returns the next token id; temperature,
    top_k and generator are then unused.

    ``constraint`` (``kael.constraints.json_schema(...)``, ``regex``, ``choice``, ``grammar``)
    makes the new tokens match it: each step samples (with ``temperature``, ``top_k`` and
    ``generator``) among the tokens its grammar allows, compiled against ``tokenizer``
    (required with it); generation ends after the end token (the tokenizer's end of text, the
    eos ids of ``model.generation_config``), which the grammar allows once the output is a
    complete match and alone once nothing can follow, and which is the last id returned.
    Reaching ``max_new_tokens`` first leaves the output cut. Not with ``sampler``.

    ``speculative`` (``"ngram"``, a ``kael.engine.Proposer`` such as ``DraftModelProposer``, or a
    ``kael.engine.Speculator``) decodes through kael's engine, verifying drafted tokens in one
    step: the same tokens as without it, greedy and seeded (``_generate_speculative``). Not with
    ``constraint``; a ``sampler`` only as a ``kael.engine.TokenSampler`` (without a constraint), which
    then samples each verified position; the prompt and new tokens must fit the context.
    """
    ids = _prompt_ids(prompt, model.vocab_size)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise KaelError(f"generate: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    check_sampling(temperature, top_k, generator, "generate")
    if on_token is not None and not callable(on_token):
        raise DTypeError(f"generate: on_token must be callable or None, got {type(on_token).__name__}")
    if sampler is not None and not callable(sampler):
        raise DTypeError(f"generate: sampler must be callable or None, got {type(sampler).__name__}")
    if constraint is not None:
        if sampler is not None:
            raise KaelError(
                "generate: give a constraint or a sampler, not both (a TokenSampler takes one in its params)"
            )
        sampler, on_token = _constrained(model, constraint, tokenizer, temperature, top_k, generator, on_token)
    elif tokenizer is not None:
        raise KaelError("generate: tokenizer is for a constraint's grammar; no constraint was given")
    if speculative is not None and (constraint is not None or not _engine_sampler(sampler)):
        raise KaelError(
            "generate: speculative decoding takes no constraint, and of samplers only a kael.engine.TokenSampler "
            "without one (the engine rolls its state back when drafts are rejected)"
        )
    if max_new_tokens == 0:
        return []
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            if speculative is not None:
                from ._generate_speculative import speculative_generate

                return speculative_generate(
                    model, ids, max_new_tokens, temperature, top_k, on_token, generator, speculative, sampler=sampler
                )
            return _loop(model, ids, max_new_tokens, temperature, top_k, on_token, generator, sampler)
    finally:
        if was_training:
            model.train()


def _engine_sampler(sampler: Any) -> bool:
    """None, or a TokenSampler without a constraint: the engine samples the request with it."""
    if sampler is None:
        return True
    from ..engine import TokenSampler

    return isinstance(sampler, TokenSampler) and sampler.matcher is None


def _constrained(
    model: CausalLM,
    constraint: Any,
    tokenizer: Any,
    temperature: float,
    top_k: int,
    generator: Generator | None,
    on_token: Callable[[int], Any] | None,
) -> tuple[Sampler, Callable[[int], Any]]:
    """A TokenSampler under ``constraint`` and an ``on_token`` that also stops after the end
    token the grammar finished on."""
    from ..engine import TokenSampler

    if tokenizer is None:
        raise KaelError("generate: a constraint needs tokenizer= (its grammar is compiled against the vocabulary)")
    ends: list[int] = []
    try:
        ends.append(int(tokenizer.eot_token))
    except (KaelError, AttributeError):  # a tokenizer with no end of text: the model's eos ids alone
        pass
    config = getattr(model, "generation_config", None)
    ends += [int(t) for t in getattr(config, "eos_token_ids", None) or () if int(t) not in ends]
    params = SamplingParams(temperature=temperature, top_k=top_k, constraint=constraint)
    sampler = TokenSampler(params, generator=generator, end_tokens=ends, tokenizer=tokenizer)
    end_set = frozenset(ends)

    def on_constrained_token(token: int) -> Any:
        keep = on_token(token) if on_token is not None else None
        return False if token in end_set else keep

    return sampler, on_constrained_token


def _loop(
    model: CausalLM,
    ids: list[int],
    n: int,
    temperature: float,
    top_k: int,
    on_token: Callable[[int], Any] | None,
    generator: Generator | None,
    sampler: Sampler | None = None,
) -> list[int]:
    from ._batched import BatchDecoder

    ctx = model.max_positions
    seq = list(ids)
    # One sequence on the paged KV cache (no prefix caching: nothing outlives the call), with blocks
    # for only the positions this call can reach.
    engine = BatchDecoder(model, 1, min(ctx, len(ids) + n), prefix_caching=False) if len(ids) < ctx else None
    logits = view(engine.prefill(0, ids), model.vocab_size) if engine is not None else _window(model, seq[-ctx:])
    out: list[int] = []
    for i in range(n):
        if sampler is None:
            token = sample_next(logits, temperature, top_k, generator)
        else:
            token = _sampled(sampler(logits, seq), model.vocab_size)
        out.append(token)
        seq.append(token)
        if on_token is not None:
            keep = on_token(token)
            if keep is not None and not keep:
                break
        if i == n - 1:
            break
        if engine is not None and len(seq) <= ctx:
            logits = select(engine.decode([0], [token]), 0, 0)
        else:
            logits = _window(model, seq[-ctx:])
    return out


def _prefill(model: CausalLM, ids: list[int], cache: PagedKVCache) -> Tensor:
    """Run the prompt through the model into the (one-row) cache; the last position's logits [V]."""
    x = tensor([ids], dtype=dt.int64, device=model.device)
    return view(model(x, cache, last_only=True), model.vocab_size)


def _window(model: CausalLM, ids: list[int]) -> Tensor:
    """The last position's logits [V] for ids (at most the context) recomputed without a cache."""
    x = tensor([ids], dtype=dt.int64, device=model.device)
    return view(model(x, last_only=True), model.vocab_size)
