"""Benchmark kael-server: /health while a generation runs, time to first token, tokens/s of a stream.

    python benchmarks/server.py --url http://127.0.0.1:8000      # a server that is running
    python benchmarks/server.py --data tests/data/tiny-gpt2       # start kael-server, measure, stop

With ``--data`` a directory lacking vocab.json / merges.txt gets them from
tests/data/gpt2-tokenizer. Prints one JSON object. Every loop is bounded in time and count,
and only loopback addresses are used when the script starts the server itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "data" / "gpt2-tokenizer"


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


def one_stream(
    client: httpx.Client, prompt: str, max_tokens: int, started: threading.Event | None = None
) -> dict[str, float]:
    """Streams /v1/completions (usage included); times the first token and the rate after it."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = last = None
    tokens = 0
    with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["text"]:
                last = time.perf_counter()
                first = first or last
                if started is not None:
                    started.set()
    assert first is not None and last is not None, "the stream produced no text"
    return {
        "ttft_s": first - start,
        "tokens": tokens,
        "tokens_per_s": (tokens - 1) / (last - first) if last > first else float("nan"),
    }


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


@contextlib.contextmanager
def started_server(data: Path, device: str) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / data.name
        checkpoint.mkdir()
        for name in ("config.json", "model.safetensors", "vocab.json", "merges.txt"):
            source = data / name if (data / name).is_file() else TOKENIZER / name
            shutil.copyfile(source, checkpoint / name)
        port = free_port()
        command = [shutil.which("kael-server") or sys.executable]
        if command[0] == sys.executable:
            command += ["-m", "kael_server.cli"]
        command += ["--data", str(checkpoint), "--device", device, "--port", str(port), "--log-level", "warning"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                        break
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("kael-server did not start")
                time.sleep(0.1)
            yield url
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="base URL of a running kael-server")
    where.add_argument("--data", type=Path, help="checkpoint directory: start kael-server on it")
    parser.add_argument("--device", default="cpu", help="with --data: the device to serve on")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each /health measurement")
    parser.add_argument("--streams", type=int, default=5, help="streams timed for TTFT and tokens/s")
    parser.add_argument("--prompt", default="The meaning of life is")
    args = parser.parse_args()
    if args.url:
        result = measure(args.url, args.seconds, args.streams, args.prompt)
    else:
        with started_server(args.data, args.device) as url:
            result = measure(url, args.seconds, args.streams, args.prompt)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
