"""Fake models and tokenizers with the shape kael's GPT and BpeTokenizer have, to force misbehaviour."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

SECRET = "s3cret-internal-detail"
"""Text of every exception the fakes raise: it must never reach a client."""

EOT = 256


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
        return bytes(ids)


@dataclass
class Call:
    prompt: list[int]
    max_new_tokens: int
    temperature: float
    top_k: int
    generator: object | None
    produced: list[int] = field(default_factory=list)


class FakeModel:
    """``generate`` as kael's GPT does it, with tokens that are easy to predict.

    * ``script``: emit these token ids in order (cycling);
    * otherwise greedy (temperature 0) picks a letter that depends only on the context, and
      sampling draws letters from ``generator`` (a ``random.Random``) or a private RNG;
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
        self._rng = random.Random()

    def generate(
        self,
        prompt: list[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int = 0,
        on_token: Callable[[int], object] | None = None,
        generator: object | None = None,
    ) -> list[int]:
        call = Call(list(prompt), max_new_tokens, temperature, top_k, generator)
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
        if call.temperature == 0:
            return ord("a") + sum(call.prompt + call.produced) % 26
        rng = generator if generator is not None else self._rng
        return ord("a") + int(rng.randrange(26))
