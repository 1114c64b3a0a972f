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
from kael.engine import Request, SchedulerOutput, StepLogits
from kael_server.protocols import ServedModel

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
    chat_template: Any = None  # a Generator's chat template comes from its tokenizer (or its own argument)

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"<|endoftext|>": EOT}

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


class FakeModel(ServedModel):
    """``generate`` as kael's GPT does it, with tokens that are easy to predict, and the same
    rules per row of its engine (``engine(rows)``: a FakeModelEngine, what a Generator built
    without a scheduler serves it through).

    * ``script``: emit these token ids in order (cycling);
    * otherwise greedy (temperature 0) picks a letter that depends only on the context, and
      sampling draws letters from ``generator`` (a ``random.Random`` or a ``kael.Generator``)
      or a private RNG;
    * with a ``sampler``, each step's logits are ``fake_logits(context)`` and the sampler picks
      (``model(ids)`` gives the same logits for every position, for prompt logprobs);
    * ``gate``: block before each token until the test lets it through;
    * ``fail_at``: raise (with SECRET) instead of producing token number ``fail_at``;
    * ``step_seconds``: compute time per token, for a server that must stay responsive.

    ``calls`` records each ``generate`` call, and each sequence its engine starts, as a Call.
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
        self.generation_config = None  # no checkpoint: the tokenizer's end of text alone ends a text
        self.weights_scheme: str | None = None
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

    def engine(self, rows: int) -> FakeModelEngine:
        return FakeModelEngine(self, rows)

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
    forced: int | None = None
    """A scripted model's next token: the logits are 0 there and -inf elsewhere."""
    vocab_size: int = 257

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self.forced is not None:
            x = np.full(self.vocab_size, -np.inf)
            x[self.forced] = 0.0
            return x.astype(dtype or np.float64)
        return fake_logits(self.context, self.vocab_size).astype(dtype or np.float64)


class FakeRows:
    """The KV side of the fake engines (kael.engine's KVBackend): rows, each with the context it
    was fed; blocks never run out and nothing is cached by prefix. ``forks`` records the
    (src, dst) of each fork, ``released`` every row given back."""

    free_blocks = 1 << 62

    def __init__(self, rows: int, max_positions: int = 1 << 20) -> None:
        self.rows = rows
        self.max_positions = max_positions
        self.contexts: dict[int, list[int]] = {}
        self.forks: list[tuple[int, int]] = []
        self.released: list[int] = []
        self._free = list(range(rows - 1, -1, -1))

    @property
    def free_rows(self) -> int:
        return len(self._free)

    def cached_prefix(self, ids: Sequence[int]) -> int:
        return 0

    def start(self, request: Request, end: int, *, spare: int = 0) -> bool:
        if not self._free:
            return False
        request.row, request.num_computed = self._take(request), 0
        self.contexts[request.row] = []
        return True

    def grow(self, request: Request, tokens: Sequence[int], *, spare: int = 0) -> bool:
        return True

    def fork(self, parent: Request, child: Request) -> bool:
        assert parent.row in self.contexts, f"row {parent.row} holds no sequence"
        if not self._free:
            return False
        child.row, child.num_computed = self._take(child), parent.num_computed
        self.forks.append((parent.row, child.row))
        self.contexts[child.row] = list(self.contexts[parent.row])
        return True

    def free(self, request: Request, *, keep: bool = True) -> None:
        row, request.row = request.row, None
        if row is None:
            return
        self.contexts.pop(row, None)
        self.released.append(row)
        self._free.append(row)

    def preempt(self, request: Request) -> None:
        self.free(request)

    def stats(self) -> dict[str, int]:
        return {}

    def _take(self, request: Request) -> int:
        row = self._free.pop()
        assert row not in self.contexts, f"row {row} is in use"
        return row


class FakeModelEngine(FakeRows):
    """FakeModel's engine (a BatchEngine), what a Generator built without a scheduler serves it
    through: each row picks its tokens by FakeModel's rules, as ``generate`` alone would (the
    script, the greedy letter of its context, letters drawn from its generator, or its sampler
    over ``fake_logits``), with the model's ``gate`` and ``step_seconds`` before each token and
    its ``fail_at``; each sequence it starts is one Call in ``model.calls`` (its ``produced``
    are the request's output ids)."""

    def __init__(self, model: FakeModel, rows: int) -> None:
        super().__init__(rows, model.max_positions)
        self.model = model
        self._seen: set[int] = set()

    def _take(self, request: Request) -> int:
        if id(request) not in self._seen:  # one Call per sequence, as one generate call each
            self._seen.add(id(request))
            params, model = request.params, self.model
            top_k = min(params.top_k, model.vocab_size)
            call = Call(list(request.prompt_ids), params.max_tokens, params.temperature, top_k, request.generator)
            call.sampler, call.produced = request.sampler, request.output_ids
            model.calls.append(call)
        return super()._take(request)

    def execute(self, plan: SchedulerOutput) -> StepLogits:
        out, model = StepLogits(len(plan.rows)), self.model
        for i, r in enumerate(plan.rows):
            context = self.contexts[r.row]
            context.extend(r.tokens)
            if not r.samples:
                continue
            if model.gate is not None:
                model.gate.step()
            if model.step_seconds:
                time.sleep(model.step_seconds)  # the model's compute time, not a wait for an event
            produced = len(r.request.output_ids)
            if produced == model.fail_at:
                out.errors[i] = RuntimeError(SECRET)
                continue
            forced = model.script[produced % len(model.script)] if model.script is not None else None
            out.set(i, RowLogits(r.row, tuple(context), forced, model.vocab_size))
        return out

    def sample(self, logits: RowLogits, temperature: float = 0.0, top_k: int = 0, generator: Any = None) -> int:
        if logits.forced is not None:
            return logits.forced
        if temperature == 0:
            return greedy_letter(logits.context)
        return draw_letter(generator if generator is not None else self.model._rng)

    def greedy(self, logits: list[RowLogits]) -> list[int]:
        return [self.sample(row) for row in logits]


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
    source = "{# a fake: no tool-call markers #}"

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
