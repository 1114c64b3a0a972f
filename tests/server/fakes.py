"""Fake models and tokenizers with the shape kael's GPT and BpeTokenizer have, to force misbehaviour."""

from __future__ import annotations

import random
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SECRET = "s3cret-internal-detail"
"""Text of every exception the fakes raise: it must never reach a client."""

EOT = 256


def greedy_letter(context: Sequence[int]) -> int:
    """The fakes' greedy token for a context: a letter that depends only on the context."""
    return ord("a") + sum(context) % 26


def fake_logits(context: Sequence[int], vocab_size: int = 257) -> np.ndarray:
    """The fakes' logits [V] after ``context``: pseudo-random (fixed by the context) with the
    greedy letter on top by 1, so an argmax over them is the fakes' greedy rule."""
    rng = np.random.default_rng(zlib.crc32(np.asarray(context, dtype=np.int64).tobytes()))
    x = rng.normal(0.0, 1.0, vocab_size)
    x[greedy_letter(context)] = x.max() + 1.0
    return x


def draw_letter(rng: Any) -> int:
    """A sampled letter from a ``random.Random`` or a ``kael.Generator``."""
    if hasattr(rng, "randrange"):
        return ord("a") + int(rng.randrange(26))
    return ord("a") + int(rng.numpy_rng().integers(26))


class Gate:
    """Lets a fake's steps through one at a time, under the test's control.

    A worker calls ``step()`` before each step and blocks until the test allows it;
    ``wait_arrivals(n)`` lets the test wait (with a deadline) until n steps have arrived.
    """

    def __init__(self, allowed: float = 0) -> None:
        self._cond = threading.Condition()
        self._allowed = allowed
        self.arrivals = 0

    def step(self) -> None:
        with self._cond:
            self.arrivals += 1
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: self._allowed > 0, timeout=30):
                raise TimeoutError("the test never opened the gate")
            self._allowed -= 1

    def allow(self, n: int = 1) -> None:
        with self._cond:
            self._allowed += n
            self._cond.notify_all()

    def open(self) -> None:
        self.allow(10**9)

    def wait_arrivals(self, n: int, timeout: float = 10) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.arrivals >= n, timeout=timeout)


class ByteTokenizer:
    """Byte-level: token i < 256 is byte i, 256 is end-of-text."""

    vocab_size = 257
    eot_token = EOT

    def __init__(self, gate: Gate | None = None, fail: bool = False) -> None:
        self.gate = gate
        self.fail = fail
        self.encoded: list[str] = []

    def encode(self, text: str) -> list[int]:
        if self.gate is not None:
            self.gate.step()
        if self.fail:
            raise RuntimeError(SECRET)
        self.encoded.append(text)
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> bytes:
        return b"".join(b"<|endoftext|>" if i == EOT else bytes((i,)) for i in ids)


@dataclass
class Call:
    prompt: list[int]
    max_new_tokens: int
    temperature: float
    top_k: int
    generator: object | None
    sampler: object | None = None
    produced: list[int] = field(default_factory=list)


class FakeModel:
    """``generate`` as kael's GPT does it, with tokens that are easy to predict.

    * ``script``: emit these token ids in order (cycling);
    * otherwise greedy (temperature 0) picks a letter that depends only on the context, and
      sampling draws letters from ``generator`` (a ``random.Random`` or a ``kael.Generator``)
      or a private RNG;
    * with a ``sampler``, each step's logits are ``fake_logits(context)`` and the sampler picks
      (``model(ids)`` gives the same logits for every position, for prompt logprobs);
    * ``gate``: block before each token until the test lets it through;
    * ``fail_at``: raise (with SECRET) instead of producing token number ``fail_at``;
    * ``step_seconds``: compute time per token, for a server that must stay responsive.
    """

    def __init__(
        self,
        script: Sequence[int] | bytes | None = None,
        *,
        max_positions: int = 128,
        vocab_size: int = 257,
        gate: Gate | None = None,
        fail_at: int | None = None,
        step_seconds: float = 0.0,
    ) -> None:
        self.script = list(script) if script is not None else None
        self.max_positions = max_positions
        self.vocab_size = vocab_size
        self.gate = gate
        self.fail_at = fail_at
        self.step_seconds = step_seconds
        self.calls: list[Call] = []
        self.scored: list[list[int]] = []
        self.training = False
        self.device = "cpu"
        self._rng = random.Random()

    def eval(self) -> FakeModel:
        self.training = False
        return self

    def train(self, mode: bool = True) -> FakeModel:
        self.training = mode
        return self

    def __call__(self, ids: Any) -> np.ndarray:
        """Logits [1, T, V] for ids [1, T] (a kael tensor): ``fake_logits`` of each prefix."""
        row = [int(i) for i in np.asarray(ids)[0]]
        self.scored.append(row)
        return np.stack([fake_logits(row[: t + 1], self.vocab_size) for t in range(len(row))])[None]

    def generate(
        self,
        prompt: list[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int = 0,
        on_token: Callable[[int], object] | None = None,
        generator: object | None = None,
        *,
        sampler: Callable[[Any, list[int]], int] | None = None,
    ) -> list[int]:
        call = Call(list(prompt), max_new_tokens, temperature, top_k, generator, sampler)
        self.calls.append(call)
        for i in range(max_new_tokens):
            if self.gate is not None:
                self.gate.step()
            if self.step_seconds:
                time.sleep(self.step_seconds)  # the model's compute time, not a wait for an event
            if i == self.fail_at:
                raise RuntimeError(SECRET)
            token = self._next(i, call, generator)
            call.produced.append(token)
            if on_token is not None and not on_token(token):
                break
        return list(call.produced)

    def _next(self, i: int, call: Call, generator: Any) -> int:
        if self.script is not None:
            return self.script[i % len(self.script)]
        context = call.prompt + call.produced
        if call.sampler is not None:
            return int(call.sampler(fake_logits(context, self.vocab_size), context))  # type: ignore[operator]
        if call.temperature == 0:
            return greedy_letter(context)
        return draw_letter(generator if generator is not None else self._rng)


@dataclass(frozen=True)
class RowLogits:
    """What FakeBatchEngine hands back as a row's "logits": the row and its context so far
    (as an array: ``fake_logits`` of the context, what FakeModel's sampler sees)."""

    row: int
    context: tuple[int, ...]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return fake_logits(self.context).astype(dtype or np.float64)


class FakeBatchEngine:
    """A BatchEngine (kael_server.protocols) with FakeModel's token rules, per cache row.

    Greedy picks a letter from the row's context (prompt + tokens fed), exactly as FakeModel
    does for the same prompt alone; sampling draws from the job's generator. To force
    misbehaviour:

    * ``gate``: block before each decode step until the test lets it through;
    * ``fail_decode_at``: raise (with SECRET) in decode step number ``fail_decode_at`` (from 0);
    * ``fail_prefill``: raise (with SECRET) when prefilling a prompt it accepts (alone or
      in a ``prefill_many``, which then starts no row);
    * ``fail_sample``: raise (with SECRET) when sampling for a context it accepts;
    * ``poison``: for a context it accepts, sample token ``poison_token`` (which a
      PoisonTokenizer refuses to decode: a failure in that job's token handling).

    ``steps`` records the rows of every decode step; ``prefills`` the (row, prompt) of each
    prefill; ``prefill_calls`` the rows of each ``prefill``/``prefill_many`` call;
    ``greedy_calls`` counts the ``greedy`` calls (one per step with several greedy rows);
    ``forks`` the (src, dst) of each ``fork``.
    """

    def __init__(
        self,
        rows: int,
        *,
        gate: Gate | None = None,
        fail_decode_at: int | None = None,
        fail_prefill: Callable[[tuple[int, ...]], bool] | None = None,
        fail_sample: Callable[[tuple[int, ...]], bool] | None = None,
        poison: Callable[[tuple[int, ...]], bool] | None = None,
        poison_token: int = 0,
    ) -> None:
        self.rows = rows
        self.gate = gate
        self.fail_decode_at = fail_decode_at
        self.fail_prefill = fail_prefill
        self.fail_sample = fail_sample
        self.poison = poison
        self.poison_token = poison_token
        self.contexts: dict[int, list[int]] = {}
        self.steps: list[list[int]] = []
        self.prefills: list[tuple[int, list[int]]] = []
        self.prefill_calls: list[list[int]] = []
        self.greedy_calls = 0
        self.forks: list[tuple[int, int]] = []
        self.released: list[int] = []
        self._rng = random.Random()

    def prefill(self, row: int, prompt: list[int]) -> RowLogits:
        return self.prefill_many([row], [prompt])[0]

    def prefill_many(self, rows: list[int], prompts: list[list[int]]) -> list[RowLogits]:
        self.prefill_calls.append(list(rows))
        for row, prompt in zip(rows, prompts, strict=True):
            assert row not in self.contexts, f"row {row} is in use"
            assert 0 <= row < self.rows
            if self.fail_prefill is not None and self.fail_prefill(tuple(prompt)):
                raise RuntimeError(SECRET)
        for row, prompt in zip(rows, prompts, strict=True):
            self.contexts[row] = list(prompt)
            self.prefills.append((row, list(prompt)))
        return [RowLogits(row, tuple(prompt)) for row, prompt in zip(rows, prompts, strict=True)]

    def decode(self, rows: list[int], tokens: list[int]) -> list[RowLogits]:
        if self.gate is not None:
            self.gate.step()
        step = len(self.steps)
        self.steps.append(list(rows))
        if step == self.fail_decode_at:
            raise RuntimeError(SECRET)
        for row, token in zip(rows, tokens, strict=True):
            self.contexts[row].append(token)
        return [RowLogits(row, tuple(self.contexts[row])) for row in rows]

    def sample(self, logits: RowLogits, temperature: float = 0.0, top_k: int = 0, generator: Any = None) -> int:
        if self.fail_sample is not None and self.fail_sample(logits.context):
            raise RuntimeError(SECRET)
        if self.poison is not None and self.poison(logits.context):
            return self.poison_token
        if temperature == 0:
            return greedy_letter(logits.context)
        return draw_letter(generator if generator is not None else self._rng)

    def greedy(self, logits: list[RowLogits]) -> list[int]:
        self.greedy_calls += 1
        return [self.sample(row) for row in logits]

    def fork(self, src: int, dst: int) -> None:
        assert src in self.contexts, f"row {src} holds no sequence"
        assert dst not in self.contexts and 0 <= dst < self.rows, f"row {dst} is in use"
        self.forks.append((src, dst))
        self.contexts[dst] = list(self.contexts[src])

    def release(self, row: int) -> None:
        self.contexts.pop(row, None)
        self.released.append(row)

    # KV memory: a contiguous cache of one context per row, never full (BatchEngine's paged members)
    paged = False
    block_size = 1 << 20
    free_blocks = 1 << 62

    def blocks_needed(self, rows: Sequence[int]) -> int:
        return 0

    def preempt(self, row: int) -> None:
        self.release(row)

    def cached_tokens(self, row: int) -> int:
        return 0

    def kv_stats(self) -> dict[str, int]:
        return {}


class PoisonTokenizer(ByteTokenizer):
    """A ByteTokenizer whose ``decode`` raises (with SECRET) on one token id."""

    def __init__(self, poison_token: int) -> None:
        super().__init__()
        self.poison_token = poison_token

    def decode(self, ids: list[int]) -> bytes:
        if self.poison_token in ids:
            raise RuntimeError(SECRET)
        return super().decode(ids)


END_OF_TURN = 4
"""The byte FakeChatTemplate ends a turn with (ASCII end of transmission)."""


class FakeChatTemplate:
    """A chat template with ``kael.tokenizer.ChatTemplate``'s interface: each message as
    ``[role]content`` + byte 4, then ``[assistant]`` for the generation prompt. A message whose
    content is ``"refuse"`` makes it raise a ChatTemplateError naming ``name``, as a template's
    ``raise_exception`` does."""

    name = "/srv/models/secret-path/chat_template.jinja"

    def __init__(self, end_of_turn: tuple[int, ...] = (END_OF_TURN,)) -> None:
        self.end_of_turn = end_of_turn
        self.rendered: list[list[dict[str, Any]]] = []

    def render(self, messages: Sequence[Any], *, add_generation_prompt: bool = True, **kwargs: Any) -> str:
        import kael

        self.rendered.append([dict(m) for m in messages])
        if any(m["content"] == "refuse" for m in messages):
            raise kael.ChatTemplateError(f"{self.name}: the chat template refused the messages: no refusals")
        text = "".join(f"[{m['role']}]{m['content']}\x04" for m in messages)
        return text + ("[assistant]" if add_generation_prompt else "")

    def end_of_turn_tokens(self, tokenizer: Any) -> tuple[int, ...]:
        return self.end_of_turn
