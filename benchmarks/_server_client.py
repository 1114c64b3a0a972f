"""The client side of benchmarks/server.py: timed streams, /health latencies and the K-client load sweep.

Everything here talks HTTP to a server that is already running (kael-server or llama-server,
the same OpenAI completions API); starting and stopping servers stays in server.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import statistics
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

__all__ = [
    "percentile",
    "health_latencies",
    "completion_body",
    "StreamTiming",
    "one_stream",
    "background_streams",
    "measure",
    "free_port",
    "exact_prompt",
    "SseClient",
    "load_round",
    "summarize",
    "measure_load",
    "sweep",
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def health_latencies(client: httpx.Client, seconds: float, max_requests: int = 20_000) -> dict[str, float]:
    """Sequential GET /health on one keep-alive connection for ``seconds``."""
    latencies: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds and len(latencies) < max_requests:
        t = time.perf_counter()
        client.get("/health").raise_for_status()
        latencies.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    return {
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(percentile(latencies, 0.50) * 1e3, 3),
        "p99_ms": round(percentile(latencies, 0.99) * 1e3, 3),
    }


def completion_body(prompt: str, max_tokens: int) -> dict[str, Any]:
    """A greedy streamed /v1/completions request with usage in its last event."""
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


class StreamTiming:
    """Times one completion stream from its events: the first token, and the rate after it."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None
        self.tokens = 0
        self.events = 0  # text events: the token count when a server sends no usage

    def event(self, data: str | bytes) -> bool:
        """Reads the data of one ``data:`` event; True if it carried text."""
        if data in ("[DONE]", b"[DONE]"):
            return False
        chunk = json.loads(data)
        if chunk.get("usage"):
            self.tokens = chunk["usage"]["completion_tokens"]
            return False
        if not (chunk["choices"] and chunk["choices"][0]["text"]):
            return False
        self.last = time.perf_counter()
        self.first = self.first or self.last
        self.events += 1
        return True

    def result(self) -> dict[str, float]:
        first, last = self.first, self.last
        if first is None or last is None:
            raise RuntimeError("the stream produced no text")
        tokens = self.tokens or self.events
        return {
            "ttft_s": first - self.start,
            "tokens": tokens,
            "tokens_per_s": (tokens - 1) / (last - first) if last > first else float("nan"),
        }


def one_stream(
    client: httpx.Client, prompt: str, max_tokens: int, started: threading.Event | None = None
) -> dict[str, float]:
    """Streams /v1/completions (usage included); times the first token and the rate after it."""
    timing = StreamTiming()
    with client.stream("POST", "/v1/completions", json=completion_body(prompt, max_tokens)) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and timing.event(line[6:]) and started is not None:
                started.set()
    return timing.result()


def background_streams(
    url: str, stop: threading.Event, started: threading.Event, prompt: str, max_tokens: int
) -> threading.Thread:
    """Keeps one generation running, stream after stream, until ``stop`` is set."""

    def run() -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            while not stop.is_set():
                one_stream(client, prompt, max_tokens, started)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def measure(url: str, seconds: float, streams: int, prompt: str) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=120) as client:
        context = client.get("/v1/models").json()["data"][0]["max_model_len"]
        prompt_tokens = client.post("/tokenize", json={"prompt": prompt}).json()["count"]
        max_tokens = min(512, context - prompt_tokens)
        one_stream(client, prompt, max_tokens)  # warm-up
        runs = [one_stream(client, prompt, max_tokens) for _ in range(streams)]
        idle = health_latencies(client, seconds)
        stop, started = threading.Event(), threading.Event()
        worker = background_streams(url, stop, started, prompt, max_tokens)
        if not started.wait(60):
            raise RuntimeError("the background generation never started")
        busy = health_latencies(client, seconds)
        stop.set()
        worker.join(timeout=120)
    return {
        "url": url,
        "prompt_tokens": prompt_tokens,
        "max_tokens": max_tokens,
        "stream": {
            "runs": streams,
            "ttft_ms_median": round(statistics.median(r["ttft_s"] for r in runs) * 1e3, 2),
            "tokens_per_s_median": round(statistics.median(r["tokens_per_s"] for r in runs), 1),
        },
        "health_idle": idle,
        "health_while_generating": busy,
        "health_p50_ratio_busy_over_idle": round(busy["p50_ms"] / idle["p50_ms"], 2),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def exact_prompt(client: httpx.Client, tokens: int) -> str:
    """A prompt of exactly ``tokens`` tokens for the served tokenizer (cut from a longer text)."""
    text = " ".join(["The quick brown fox jumps over the lazy dog while the band plays on."] * (tokens // 4 + 2))
    ids = client.post("/tokenize", json={"prompt": text}).json()["tokens"]
    for n in range(tokens, max(0, tokens - 4), -1):
        prompt = client.post("/detokenize", json={"tokens": ids[:n]}).json()["prompt"]
        while client.post("/tokenize", json={"prompt": prompt}).json()["count"] < tokens:
            prompt += " the"
        if client.post("/tokenize", json={"prompt": prompt}).json()["count"] == tokens:
            return str(prompt)
    raise RuntimeError(f"no prompt of exactly {tokens} tokens found")


class SseClient:
    """A minimal HTTP/1.1 keep-alive client for the load mode: streamed POSTs on one connection,
    server-sent events split as they arrive. It is light on purpose: the load generator shares
    the machine with the server, and what it spends per token is taken from the model (httpx in
    a thread per client took a measurable share of a batched decode step's CPU)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None

    async def stream(self, body: bytes) -> dict[str, float]:
        """POSTs ``body`` to /v1/completions (stream, usage included); times as ``one_stream`` does."""
        if self.reader is None or self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        reader = self.reader
        timing = StreamTiming()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        line = await reader.readline()
        if not line:  # the server closed the kept-alive connection (llama-server does after a stream): reconnect once
            await self.close()
            reader, writer = await asyncio.open_connection(self.host, self.port)
            self.reader, self.writer = reader, writer
            writer.write(head.encode() + body)
            line = await reader.readline()
        status = int(line.split()[1])
        headers: dict[bytes, bytes] = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if status != 200 or headers.get(b"transfer-encoding") != b"chunked":
            text = await reader.read(min(int(headers.get(b"content-length", b"200")), 4096))
            await self.close()
            raise RuntimeError(f"HTTP {status}: {text[:200]!r}")
        pending = b""
        while size := int((await reader.readline()).split(b";")[0], 16):
            pending += (await reader.readexactly(size + 2))[:-2]
            while (cut := pending.find(b"\n\n")) >= 0:
                event, pending = pending[:cut], pending[cut + 2 :]
                if event.startswith(b"data: "):
                    timing.event(event[6:])
        await reader.readline()  # the empty trailer after the last chunk
        return timing.result()


def load_round(url: str, clients: int, prompt: str, max_tokens: int, rounds: int) -> dict[str, Any]:
    """``clients`` streaming clients (one thread, asyncio), each streaming ``rounds`` completions
    one after the other, all starting together."""
    body = json.dumps(completion_body(prompt, max_tokens)).encode()
    runs: list[dict[str, float]] = []
    errors: list[str] = []

    async def client_loop(client: SseClient) -> None:
        for _ in range(rounds):
            try:
                runs.append(await asyncio.wait_for(client.stream(body), timeout=600))
            except Exception as exc:  # counted and reported, never hidden
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                await client.close()  # a fresh connection for the next stream

    async def run_all() -> float:
        connections = [SseClient(url) for _ in range(clients)]
        start = time.perf_counter()
        try:
            await asyncio.gather(*(client_loop(c) for c in connections))
            return time.perf_counter() - start
        finally:
            for c in connections:
                await c.close()

    wall = asyncio.run(run_all())
    return {"runs": runs, "errors": errors, "wall_s": wall}


def summarize(clients: int, passes: list[dict[str, Any]]) -> dict[str, Any]:
    """One K over its passes: the median pass's aggregate rate; the streams of every pass pooled."""
    runs = [r for p in passes for r in p["runs"]]
    errors = [e for p in passes for e in p["errors"]]
    rates = [sum(int(r["tokens"]) for r in p["runs"]) / p["wall_s"] for p in passes]
    ttfts = [r["ttft_s"] for r in runs]
    per_stream = [r["tokens_per_s"] for r in runs if r["tokens_per_s"] == r["tokens_per_s"]]
    return {
        "clients": clients,
        "streams": len(runs),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:3],
        "tokens": sum(int(r["tokens"]) for r in runs),
        "wall_s": round(sum(p["wall_s"] for p in passes), 2),
        "aggregate_tokens_per_s": round(statistics.median(rates), 2),
        "aggregate_tokens_per_s_passes": [round(r, 2) for r in rates],
        "per_stream_tokens_per_s_median": round(statistics.median(per_stream), 2) if per_stream else None,
        # inter-token latency of a stream: its time after the first token over the tokens after it
        "itl_ms_median": round(1000 / statistics.median(per_stream), 2) if per_stream else None,
        "ttft_p50_s": round(percentile(ttfts, 0.50), 3) if ttfts else None,
        "ttft_p90_s": round(percentile(ttfts, 0.90), 3) if ttfts else None,
        "ttft_p99_s": round(percentile(ttfts, 0.99), 3) if ttfts else None,
    }


def measure_load(
    url: str, clients: list[int], prompt_tokens: int, max_tokens: int, rounds: int, passes: int
) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=600) as client:
        model = client.get("/v1/models").json()["data"][0]
        prompt = exact_prompt(client, prompt_tokens)
        max_tokens = min(max_tokens, model["max_model_len"] - prompt_tokens)
    return {
        "url": url,
        "model": model["id"],
        "prompt_tokens": prompt_tokens,
        "prompt": prompt,
        **sweep(url, clients, prompt, max_tokens, rounds, passes),
    }


def sweep(url: str, clients: list[int], prompt: str, max_tokens: int, rounds: int, passes: int) -> dict[str, Any]:
    """The load sweep over K against any server with a streaming /v1/completions (kael's or llama.cpp's)."""
    with httpx.Client(base_url=url, timeout=600) as client:
        one_stream(client, prompt, 4)  # warm-up: first-call allocations, caches
    # Whole sweeps over K, one after another: a slow spell of a shared machine then
    # touches every K rather than one of them.
    done: dict[int, list[dict[str, Any]]] = {k: [] for k in clients}
    for _ in range(passes):
        for k in clients:
            done[k].append(load_round(url, k, prompt, max_tokens, rounds))
    results = [summarize(k, done[k]) for k in clients]
    base = results[0]["aggregate_tokens_per_s"] if results and results[0]["clients"] == 1 else None
    for r in results:
        r["aggregate_over_one_client"] = round(r["aggregate_tokens_per_s"] / base, 2) if base else None
    return {
        "max_tokens": max_tokens,
        "rounds_per_client": rounds,
        "passes": passes,
        "load": results,
    }
