"""Continuous batching with kael's GPT-2: every answer is what the request gets alone.

Oracles: the greedy continuations Hugging Face transformers made for the tiny reference
checkpoint (tests/data/tiny-gpt2, top-1/top-2 gaps >= 0.002), and the single-slot server
(``model.generate``, one request at a time) for everything else. A gate holds the decode
steps so that requests join a running batch at chosen steps.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import numpy as np
import pytest
from kael.engine import KVManager, ModelRunner, Request, SchedulerOutput
from kael.engine import StepLogits as EngineLogits
from kael_server.batching import BatchScheduler
from litestar import Litestar

from kael_server import Generator, create_app

from .asgi import Exchange
from .conftest import generator_of, poll_until, samples
from .fakes import SECRET, Gate
from .processes import free_port, server_process

kael = pytest.importorskip("kael")
if not hasattr(kael, "GPT") or not hasattr(kael.models, "BatchDecoder"):
    pytest.skip("kael's GPT-2 and BatchDecoder are not there yet", allow_module_level=True)

DATA = Path(__file__).resolve().parents[1] / "data"
CHECKPOINT = DATA / "tiny-gpt2"
TOKENIZER = DATA / "gpt2-tokenizer"
REFERENCE = json.loads((CHECKPOINT / "reference.json").read_text())
CASES = [c for c in REFERENCE["cases"] if c["prompt"] is not None]
EOT = 50256


@pytest.fixture(scope="module")
def model() -> Any:
    return kael.GPT.from_pretrained(CHECKPOINT)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return kael.BpeTokenizer.from_directory(TOKENIZER)


def seeded(seed: int) -> Any:
    return kael.Generator().manual_seed(seed)


def reference_text(tokenizer: Any, ids: list[int]) -> str:
    """What the server answers for these generated ids: up to end-of-text, invalid UTF-8 as U+FFFD."""
    if EOT in ids:
        ids = ids[: ids.index(EOT)]
    return b"".join(tokenizer.decode([t]) for t in ids).decode("utf-8", errors="replace")


class RowLogits(NamedTuple):
    """One row's logits as Probe hands them out: (engine row, its logits), and as an array the
    logits themselves (what a kael.models.TokenSampler reads)."""

    row: int
    values: Any

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.values, dtype=dtype)


class StepLogits:
    """A decode step's logits as Probe hands them out: row i is RowLogits(engine row, its logits)."""

    def __init__(self, rows: list[int], values: Any) -> None:
        self.rows, self.values = list(rows), values

    def __getitem__(self, i: int) -> RowLogits:
        return RowLogits(self.rows[i], kael.select(self.values, 0, i))


class Probe:
    """kael's KVManager and ModelRunner over a BatchDecoder (a BatchEngine), with a gate before
    each step that decodes and, optionally, a sampling failure for one prompt at its token
    number ``fail_at``; records the decode rows of each step, the prefill rows of each step,
    the forks and the greedy calls."""

    def __init__(self, engine: Any, gate: Gate, fail_prompt: list[int] | None = None, fail_at: int = 2) -> None:
        self.kv, self.runner, self.rows = KVManager(engine), ModelRunner(engine), engine.rows
        self.gate, self.fail_prompt, self.fail_at = gate, fail_prompt, fail_at
        self.prompts: dict[int, list[int]] = {}
        self.sampled: dict[int, int] = {}
        self.steps: list[list[int]] = []
        self.prefill_calls: list[list[int]] = []
        self.forks: list[tuple[int, int]] = []
        self.greedy_calls = 0

    # kael.engine.KVBackend: the KVManager's own
    @property
    def free_rows(self) -> int:
        return self.kv.free_rows

    @property
    def free_blocks(self) -> int:
        return self.kv.free_blocks

    @property
    def max_positions(self) -> int:
        return self.kv.max_positions

    def cached_prefix(self, ids: Sequence[int]) -> int:
        return self.kv.cached_prefix(ids)

    def start(self, request: Request, end: int, *, spare: int = 0) -> bool:
        if not self.kv.start(request, end, spare=spare):
            return False
        assert request.row is not None
        self.prompts[request.row], self.sampled[request.row] = list(request.prompt_ids), 0
        return True

    def grow(self, request: Request, tokens: Sequence[int], *, spare: int = 0) -> bool:
        return self.kv.grow(request, tokens, spare=spare)

    def fork(self, parent: Request, child: Request) -> bool:
        if not self.kv.fork(parent, child):
            return False
        assert parent.row is not None and child.row is not None
        self.forks.append((parent.row, child.row))
        self.prompts[child.row], self.sampled[child.row] = self.prompts[parent.row], self.sampled[parent.row]
        return True

    def free(self, request: Request, *, keep: bool = True) -> None:
        self.kv.free(request, keep=keep)

    def preempt(self, request: Request) -> None:
        self.kv.preempt(request)

    def stats(self) -> dict[str, int]:
        return self.kv.stats()

    # kael.engine.Runner: the ModelRunner's, its logits tagged with their rows
    def execute(self, plan: SchedulerOutput) -> EngineLogits:
        extend = [r.row for r in plan.rows if not r.decode]
        decode = [r.row for r in plan.rows if r.decode]
        if extend:
            self.prefill_calls.append(extend)
        if decode:
            self.gate.step()
            self.steps.append(decode)
        out = self.runner.execute(plan)
        for i, r in enumerate(plan.rows):
            if out.row(i) is not None:
                out.set(i, RowLogits(r.row, out.row(i)))
        out.batches = [(StepLogits([plan.rows[i].row for i in idx], batch), idx) for batch, idx in out.batches]
        return out

    def sample(self, logits: RowLogits, temperature: float = 0.0, top_k: int = 0, generator: Any = None) -> int:
        self._count([logits.row])
        return int(self.runner.sample(logits.values, temperature, top_k, generator))

    def greedy(self, logits: StepLogits) -> list[int]:
        self._count(logits.rows)
        self.greedy_calls += 1
        return list(self.runner.greedy(logits.values))

    def _count(self, rows: list[int]) -> None:
        """One more token sampled for each of ``rows``; raises for the doomed prompt's token ``fail_at``."""
        if any(self.prompts[r] == self.fail_prompt and self.sampled[r] == self.fail_at for r in rows):
            raise RuntimeError(SECRET)
        for r in rows:
            self.sampled[r] += 1


def apps(model: Any, tokenizer: Any, probe: Probe | None = None) -> Litestar:
    """The batching server around ``probe``, or the single-slot server without one."""
    make = None if probe is None else (lambda g: BatchScheduler(g, probe))
    return create_app(Generator(model, tokenizer, make_rng=seeded, make_scheduler=make))


async def answer(app: Litestar, payload: dict[str, Any]) -> str:
    exchange = Exchange(app, "/generate", payload).start()
    await exchange.finish()
    assert exchange.status == 200, exchange.received
    if payload.get("stream"):
        events = exchange.events()
        assert events[-1] == "[DONE]"
        return "".join(json.loads(e)["text"] for e in events[:-1])
    return str(json.loads(exchange.received)["text"])


async def encoded(app: Litestar, n: int) -> None:
    scheduler = generator_of(app).scheduler
    assert isinstance(scheduler, BatchScheduler)

    def ready() -> bool:
        with scheduler._changed:
            return sum(e.ids is not None for e in (*scheduler._slotted.values(), *scheduler._queue)) >= n

    assert await asyncio.to_thread(poll_until, ready)


@pytest.mark.anyio
async def test_greedy_batched_equals_alone_joining_at_different_steps(model: Any, tokenizer: Any) -> None:
    gate = Gate()
    probe = Probe(kael.models.BatchDecoder(model, 4), gate)
    app = apps(model, tokenizer, probe)
    payloads = [{"prompt": c["prompt"], "max_tokens": 20, "temperature": 0} for c in CASES]
    payloads.append({"prompt": "Once upon a time, in a land far away, there lived", "max_tokens": 14, "temperature": 0})
    first = Exchange(app, "/generate", payloads[0]).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 1)
    second = Exchange(app, "/generate", {**payloads[1], "stream": True}).start()
    await encoded(app, 2)
    gate.allow(3)
    assert await asyncio.to_thread(gate.wait_arrivals, 4)
    rest = [Exchange(app, "/generate", p).start() for p in payloads[2:]]
    await encoded(app, 4)
    gate.open()
    for exchange in (first, second, *rest):
        await exchange.finish()
    streamed = "".join(json.loads(e)["text"] for e in second.events()[:-1])
    got = [json.loads(first.received)["text"], streamed, *(json.loads(e.received)["text"] for e in rest)]
    for case, text in zip(CASES, got):
        assert text == reference_text(tokenizer, case["greedy_20"])
    alone = apps(model, tokenizer)
    assert got[3] == await answer(alone, payloads[3])
    # a request decodes from the step after its prefill (kael.engine: one forward pass per step)
    assert [len(rows) for rows in probe.steps[:6]] == [1, 1, 2, 2, 2, 4]
    assert [len(rows) for rows in probe.prefill_calls] == [1, 1, 2]  # the last two prompts: one call
    assert probe.greedy_calls >= 16  # steps with several greedy rows pick their tokens in one call


@pytest.mark.anyio
async def test_seeded_samples_do_not_depend_on_what_runs_alongside(model: Any, tokenizer: Any) -> None:
    gate = Gate()
    probe = Probe(kael.models.BatchDecoder(model, 3), gate)
    app = apps(model, tokenizer, probe)
    payloads = [
        {"prompt": "The meaning of life is", "max_tokens": 16, "temperature": 0.9, "seed": 7},
        {"prompt": "Hello world", "max_tokens": 12, "temperature": 1.3, "top_k": 5, "seed": 8},
        {"prompt": "def fibonacci(n):", "max_tokens": 10, "temperature": 0.6, "seed": 9, "stream": True},
    ]
    exchanges = [Exchange(app, "/generate", payloads[0]).start()]
    assert await asyncio.to_thread(gate.wait_arrivals, 1)
    exchanges += [Exchange(app, "/generate", p).start() for p in payloads[1:]]
    await encoded(app, 3)
    gate.open()
    for exchange in exchanges:
        await exchange.finish()
    alone = apps(model, tokenizer)
    want = [await answer(alone, p) for p in payloads]
    got = [json.loads(e.received)["text"] for e in exchanges[:2]]
    got.append("".join(json.loads(e)["text"] for e in exchanges[2].events()[:-1]))
    assert got == want
    assert max(len(rows) for rows in probe.steps) == 3
    assert [len(rows) for rows in probe.prefill_calls] == [1, 2]  # prefilled together, sampled apart


@pytest.mark.anyio
async def test_cancelled_and_failing_requests_leave_the_others_unchanged(model: Any, tokenizer: Any) -> None:
    gate = Gate()
    doomed = "A request that fails"
    probe = Probe(kael.models.BatchDecoder(model, 4), gate, fail_prompt=tokenizer.encode(doomed), fail_at=3)
    app = apps(model, tokenizer, probe)
    keep = [
        {"prompt": "Hello world", "max_tokens": 18, "temperature": 0},
        {"prompt": "The meaning of life is", "max_tokens": 15, "temperature": 0.8, "seed": 3, "stream": True},
    ]
    kept = [Exchange(app, "/generate", p).start() for p in keep]
    leaving = Exchange(app, "/generate", {"prompt": "Goodbye", "max_tokens": 40, "stream": True}).start()
    failing = Exchange(app, "/generate", {"prompt": doomed, "max_tokens": 10, "temperature": 0}).start()
    await encoded(app, 4)
    gate.allow(4)
    assert await asyncio.to_thread(gate.wait_arrivals, 5)
    leaving.disconnect()
    await leaving.finish()
    gate.open()
    await failing.finish()
    for exchange in kept:
        await exchange.finish()
    assert failing.status == 500 and SECRET not in failing.received.decode()
    alone = apps(model, tokenizer)
    assert json.loads(kept[0].received)["text"] == await answer(alone, keep[0])
    assert "".join(json.loads(e)["text"] for e in kept[1].events()[:-1]) == await answer(alone, keep[1])
    assert 4 in {len(rows) for rows in probe.steps}  # all four shared steps before two left
    assert probe.greedy_calls >= 2  # the greedy pair shared calls until the doomed one failed
    m = samples(generator_of(app).metrics.render().decode())
    outcomes = {s: m[("kael_requests_total", (("status", s),))] for s in ("ok", "error", "cancelled")}
    assert outcomes == {"ok": 2, "error": 1, "cancelled": 1}
    assert m[("kael_requests_in_flight", ())] == 0


@pytest.mark.anyio
async def test_choices_penalties_nucleus_and_logprobs_batched_are_as_alone(model: Any, tokenizer: Any) -> None:
    gate = Gate()
    probe = Probe(kael.models.BatchDecoder(model, 8), gate)
    app = apps(model, tokenizer, probe)
    payloads: list[dict[str, Any]] = [
        {"prompt": "Hello world", "max_tokens": 12, "temperature": 0},
        {"prompt": "The meaning of life is", "max_tokens": 10, "temperature": 0.9, "n": 2, "seed": 70},
        {"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0, "frequency_penalty": 1.2, "logprobs": 3},
        {"prompt": "def fibonacci(n):", "max_tokens": 10, "temperature": 1.1, "top_p": 0.8, "min_p": 0.05, "seed": 9},
        {
            "prompt": ["In the", "A"],
            "max_tokens": 6,
            "temperature": 0,
            "logit_bias": {"13": 5},
            "echo": True,
            "logprobs": 1,
        },
    ]
    first = Exchange(app, "/v1/completions", payloads[0]).start()
    assert await asyncio.to_thread(gate.wait_arrivals, 1)
    rest = [Exchange(app, "/v1/completions", p).start() for p in payloads[1:]]
    await encoded(app, len(payloads))
    gate.open()
    for exchange in (first, *rest):
        await exchange.finish()
        assert exchange.status == 200, exchange.received
    alone = apps(model, tokenizer)
    for exchange, payload in zip((first, *rest), payloads, strict=True):
        want = Exchange(alone, "/v1/completions", payload).start()
        await want.finish()
        got, expected = json.loads(exchange.received)["choices"], json.loads(want.received)["choices"]
        for mine, theirs in zip(got, expected, strict=True):
            assert mine["text"] == theirs["text"] and mine["finish_reason"] == theirs["finish_reason"]
            if theirs["logprobs"] is not None:  # the same tokens; logprobs equal up to float rounding
                assert mine["logprobs"]["tokens"] == theirs["logprobs"]["tokens"]
                for a, b in zip(mine["logprobs"]["token_logprobs"], theirs["logprobs"]["token_logprobs"], strict=True):
                    assert (a is None and b is None) or abs(a - b) < 1e-5
    assert [len(rows) for rows in probe.prefill_calls] == [1, 5]  # one row per prompt
    assert len(probe.forks) == 1  # the n=2 request's second choice
    assert max(len(rows) for rows in probe.steps) == 7
    seeded = [c["text"] for c in json.loads(rest[0].received)["choices"]]
    assert len(set(seeded)) == 2  # seed 70 and seed 71


@pytest.mark.e2e
def test_kael_server_with_slots_streams_concurrent_greedy_answers(tmp_path: Path) -> None:
    directory = tmp_path / "tiny-gpt2"
    directory.mkdir()
    for name, folder in (("config.json", CHECKPOINT), ("model.safetensors", CHECKPOINT)):
        shutil.copyfile(folder / name, directory / name)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(TOKENIZER / name, directory / name)
    port = free_port()
    command = [shutil.which("kael-server") or sys.executable]
    if command[0] == sys.executable:
        command += ["-m", "kael_server.cli"]
    command += ["--data", str(directory), "--port", str(port), "--slots", "3", "--queue", "2", "--log-format", "json"]
    tokenizer = kael.BpeTokenizer.from_directory(TOKENIZER)
    url = f"http://127.0.0.1:{port}"

    def stream(case: dict[str, Any]) -> str:
        body = {"prompt": case["prompt"], "max_tokens": 20, "temperature": 0, "stream": True}
        with httpx.Client(base_url=url, timeout=60) as client, client.stream("POST", "/generate", json=body) as r:
            assert r.status_code == 200
            events = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return "".join(json.loads(e)["text"] for e in events[:-1])

    with server_process(command, port) as process, ThreadPoolExecutor(len(CASES)) as pool:
        texts = list(pool.map(stream, CASES))
        assert texts == [reference_text(tokenizer, c["greedy_20"]) for c in CASES]
        m = samples(httpx.get(f"{url}/metrics").text)
        assert m[("kael_requests_total", (("status", "ok"),))] == len(CASES)
        assert m[("kael_batch_size_count", ())] >= 19  # each answer took 19 decode steps, some shared
        assert m[("kael_queue_wait_seconds_count", ())] == len(CASES)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=40) in (0, -signal.SIGTERM)
