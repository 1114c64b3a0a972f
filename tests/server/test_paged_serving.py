"""The batch scheduler over kael's paged KV cache (NOTE [kv memory] in kael_server/batching.py).

Oracles: the single-slot server (``model.generate``, one request at a time) for every answer,
whether its sequence was parked, preempted and recomputed, or served from the prefix cache;
the pool's own counters for the metrics; OpenAI's usage shape for ``cached_tokens``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from kael_server.batching import BatchScheduler
from kael_server.errors import ServerConfigError
from kael_server.loading import load_app
from litestar import Litestar
from litestar.testing import TestClient

from kael_server import Generator, create_app

from .asgi import Exchange
from .conftest import generator_of, samples

kael = pytest.importorskip("kael")

DATA = Path(__file__).resolve().parents[1] / "data"
CHECKPOINT = DATA / "tiny-gpt2"
TOKENIZER = DATA / "gpt2-tokenizer"
EOT = 50256
PROMPTS = [
    "Once upon a time",
    "The quick brown fox jumps over",
    "In a hole in the ground there lived",
    "It was the best of times, it was",
]


@pytest.fixture(scope="module")
def model() -> Any:
    return kael.GPT.from_pretrained(CHECKPOINT)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return kael.BpeTokenizer.from_directory(TOKENIZER)


def seeded(seed: int) -> Any:
    return kael.Generator().manual_seed(seed)


def paged_app(model: Any, tokenizer: Any, engine: Any) -> tuple[Litestar, list[BatchScheduler]]:
    made: list[BatchScheduler] = []

    def make(g: Generator) -> BatchScheduler:
        made.append(BatchScheduler(g, engine, queue=8))
        return made[-1]

    return create_app(Generator(model, tokenizer, make_rng=seeded, make_scheduler=make)), made


async def texts(app: Litestar, path: str, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    exchanges = [Exchange(app, path, p).start() for p in payloads]
    for e in exchanges:
        await e.finish()
    out = []
    for e in exchanges:
        assert e.status == 200, e.received
        out.append(json.loads(e.received))
    return out


async def metrics_of(app: Litestar) -> dict[Any, float]:
    return samples(generator_of(app).metrics.render().decode())


@pytest.mark.anyio
async def test_preempted_and_parked_sequences_answer_as_alone(model: Any, tokenizer: Any) -> None:
    # The context is 64 positions: a pool of 96 (6 blocks of 16) holds one full sequence and a
    # half, so four concurrent 40-token answers must park and preempt each other.
    engine = kael.models.BatchDecoder(model, 4, kv_cache_tokens=96)
    app, made = paged_app(model, tokenizer, engine)
    payloads: list[dict[str, Any]] = [{"prompt": p, "max_tokens": 40, "temperature": 0} for p in PROMPTS]
    payloads[1] = {**payloads[1], "temperature": 0.8, "seed": 5}
    got = await texts(app, "/generate", payloads)
    alone_app = create_app(Generator(model, tokenizer, make_rng=seeded))
    want = await texts(alone_app, "/generate", payloads[:1])
    want += await texts(alone_app, "/generate", payloads[1:2])
    want += await texts(alone_app, "/generate", payloads[2:3])
    want += await texts(alone_app, "/generate", payloads[3:])
    assert [g["text"] for g in got] == [w["text"] for w in want]
    assert engine.preemptions >= 1
    m = await metrics_of(app)
    assert m[("kael_preemptions_total", ())] == engine.preemptions
    assert m[("kael_kv_blocks_total", ())] == 6
    assert m[("kael_kv_blocks_used", ())] == 0  # every sequence gave its blocks back
    assert not made[0]._core.has_unfinished
    engine.cache.pool.check()


@pytest.mark.anyio
async def test_a_repeated_prompt_is_served_from_the_prefix_cache(model: Any, tokenizer: Any) -> None:
    prompt = " ".join(PROMPTS)  # about 30 tokens: one full block to share
    n = len(tokenizer.encode(prompt))
    payload = {"prompt": prompt, "max_tokens": 8, "temperature": 0}
    for caching in (True, False):
        engine = kael.models.BatchDecoder(model, 2, prefix_caching=caching)
        app, _ = paged_app(model, tokenizer, engine)
        first, second = [(await texts(app, "/v1/completions", [payload]))[0] for _ in range(2)]
        assert first["choices"][0]["text"] == second["choices"][0]["text"]
        assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        # All but the last token: the first run's answer filled the block after its prompt's whole
        # block, so the second copies its start (NOTE [partial block] in kael.models._kv_blocks).
        assert (n - 1) // 16 * 16 + 16 <= n + 7
        cached = n - 1 if caching else 0
        assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": cached}
        assert second["usage"]["prompt_tokens"] == n
        m = await metrics_of(app)
        assert m[("kael_prefix_cache_queries_tokens_total", ())] == 2 * n
        assert m[("kael_prefix_cache_hits_tokens_total", ())] == cached
    alone_app = create_app(Generator(model, tokenizer, make_rng=seeded))
    want = (await texts(alone_app, "/v1/completions", [payload]))[0]
    assert second["choices"][0]["text"] == want["choices"][0]["text"]


def test_kv_cache_tokens_must_hold_one_context(tmp_path: Path) -> None:
    with pytest.raises(ServerConfigError, match="kv-cache-tokens"):
        load_app(CHECKPOINT, kv_cache_tokens=0)
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((CHECKPOINT / name).read_bytes())
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / name).write_bytes((TOKENIZER / name).read_bytes())
    failures: list[BaseException] = []
    reported = threading.Event()

    def on_error(exc: BaseException) -> None:
        failures.append(exc)
        reported.set()

    with TestClient(load_app(tmp_path, kv_cache_tokens=32, on_load_error=on_error)) as client:
        assert reported.wait(60)
        assert client.get("/ready").status_code == 503
    assert isinstance(failures[0], ServerConfigError)
    assert "--kv-cache-tokens 32" in str(failures[0]) and "64 positions" in str(failures[0])


@pytest.mark.anyio
async def test_slots_1_and_8_give_the_same_answers_as_alone(model: Any, tokenizer: Any) -> None:
    # one slot is a batch of one: the same engine, the same answers, greedy and seeded
    payloads: list[dict[str, Any]] = [{"prompt": p, "max_tokens": 12, "temperature": 0} for p in PROMPTS]
    payloads += [
        {"prompt": " ".join(PROMPTS), "max_tokens": 10, "temperature": 0},
        {"prompt": PROMPTS[0], "max_tokens": 10, "temperature": 0.9, "seed": 11},
        {"prompt": PROMPTS[2], "max_tokens": 10, "temperature": 1.1, "top_k": 7, "seed": 3},
    ]
    answers = []
    for slots in (1, 8):
        made: list[BatchScheduler] = []

        def make(g: Generator, slots: int = slots) -> BatchScheduler:
            made.append(BatchScheduler(g, kael.models.BatchDecoder(model, 8), queue=16, slots=slots))
            return made[-1]

        app = create_app(Generator(model, tokenizer, make_rng=seeded, make_scheduler=make))
        answers.append([g["text"] for g in await texts(app, "/generate", payloads)])
        assert made[0].capacity == slots
    alone = []  # the oracle: model.generate on each prompt alone, the same seeded generator
    for p in payloads:
        temperature, seed = float(p["temperature"]), p.get("seed")
        gen = seeded(int(seed)) if seed is not None else None
        top_k = p.get("top_k", 40)  # /generate's default
        ids = model.generate(tokenizer.encode(p["prompt"]), p["max_tokens"], temperature, top_k, generator=gen)
        ids = ids[: ids.index(EOT)] if EOT in ids else ids
        alone.append(b"".join(tokenizer.decode([t]) for t in ids).decode("utf-8", errors="replace"))
    assert answers[0] == answers[1] == alone
