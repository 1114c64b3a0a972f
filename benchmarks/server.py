"""Benchmark kael-server: /health while a generation runs, time to first token, tokens/s of a stream;
and, with ``--load``, K concurrent streaming clients against a batching server.

    python benchmarks/server.py --url http://127.0.0.1:8000      # a server that is running
    python benchmarks/server.py --data tests/data/tiny-gpt2       # start kael-server, measure, stop
    python benchmarks/server.py --load --random-gpt2 small        # GPT-2 small, random weights, --slots 8
    python benchmarks/server.py --load --random-gpt2 4,4,256 --clients 1,2,4,8 --max-tokens 64
    python benchmarks/server.py --load --random-gpt2 small --weights q8_0 --llama-server   # and llama.cpp's
    python benchmarks/server.py --load --data model.gguf --llama-server build/llama.cpp/bin/llama-server

With ``--data`` a directory lacking vocab.json / merges.txt gets them from
tests/data/gpt2-tokenizer. ``--random-gpt2`` builds the checkpoint with kael (``small`` or
``LAYERS,HEADS,DIMENSION[,CONTEXT]``, GPT-2's vocabulary; nothing is downloaded). The load
mode starts the server with ``--slots`` (default 8) and a queue as deep, sweeps K over
``--passes`` passes (default 3), and reports for each K: aggregate tokens/s (all tokens over
the wall time of a pass; the median pass, and every pass), per-stream tokens/s after the first
token (median), p50/p99 time to first token, and errors. Prints one JSON object.

``--weights S`` (any of kael-server's) is passed to the kael-server it starts. With
``--llama-server [PATH]`` (default: the binary ``scripts/build_llama_cpp.sh`` built into its cache,
found as the tests find it) the load mode also starts llama.cpp's server with as many
slots (``-np``) on the same GGUF file (``--data model.gguf``, or the random GPT-2 written as
GGUF by kael's ``save_gguf`` in ``--weights``' format) and runs the same sweep, the same
prompt and token counts, against it: its results are under ``"llama_server"``.
Every loop is bounded in time and count, and only loopback addresses are used when the
script starts the server itself.
"""

from __future__ import annotations

import argparse
import asyncio
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
from urllib.parse import urlsplit

import httpx
from _llama_cpp_bench import find_tool

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


def random_gpt2(spec: str, directory: Path) -> dict[str, Any]:
    """Writes a GPT-2 with random weights (kael's GPT-2 initialisation, seed 0) to ``directory``."""
    import kael

    if spec == "small":
        layers, heads, dimension, context = 12, 12, 768, 1024
    else:
        parts = [int(p) for p in spec.split(",")]
        layers, heads, dimension = parts[:3]
        context = parts[3] if len(parts) > 3 else 1024
    model = kael.GPT(50257, context, layers, heads, dimension, generator=kael.Generator().manual_seed(0))
    model.save_pretrained(directory)
    params = sum(p.numel() for p in model.parameters())
    return {"layers": layers, "heads": heads, "dimension": dimension, "context": context, "parameters": params}


@contextlib.contextmanager
def started_server(data: Path, device: str, extra: list[str] | None = None) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        if data.is_file():  # a GGUF file holds the model and its tokenizer
            checkpoint = data
        else:
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
        command += extra or []
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


LLAMA_SERVER = Path(find_tool("llama-server") or ROOT / "build" / "llama.cpp" / "bin" / "llama-server")
"""llama.cpp's server binary: scripts/build_llama_cpp.sh's cache (tests/llama_cpp_tools.py's lookup)."""


def write_gguf(checkpoint: Path, out: Path, weights: str | None) -> Path:
    """The checkpoint (a GPT-2 directory) as one GGUF file written by kael, in ``weights``' format."""
    import kael
    from kael.models import from_pretrained, save_gguf

    model = from_pretrained(checkpoint)
    tokenizer = kael.BpeTokenizer.from_files(TOKENIZER / "vocab.json", TOKENIZER / "merges.txt")
    save_gguf(model, out, tokenizer, weights=weights or "f32")
    return out


@contextlib.contextmanager
def started_llama_server(binary: Path, gguf: Path, slots: int, context: int) -> Iterator[str]:
    """llama.cpp's server on gguf with ``slots`` parallel sequences of ``context`` tokens each, on loopback."""
    port = free_port()
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    command += ["-np", str(slots), "-c", str(slots * context), "-b", "512"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:  # 503 while loading
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not start: {' '.join(command)}")
            time.sleep(0.1)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()


def gguf_context(gguf: Path) -> int:
    """The model's context length from a GGUF file's metadata (``{arch}.context_length``)."""
    import kael

    with kael.io.read_gguf(gguf) as f:
        arch = f.metadata["general.architecture"]
        return int(f.metadata[f"{arch}.context_length"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="base URL of a running kael-server")
    where.add_argument("--data", type=Path, help="checkpoint directory: start kael-server on it")
    where.add_argument(
        "--random-gpt2",
        metavar="SPEC",
        help="build a GPT-2 with random weights with kael (small, or LAYERS,HEADS,DIM[,CONTEXT]) and serve it",
    )
    parser.add_argument("--load", action="store_true", help="K concurrent streaming clients (see --clients)")
    parser.add_argument("--clients", default="1,2,4,8", help="with --load: the values of K, comma-separated")
    parser.add_argument("--slots", type=int, default=8, help="with --load and a started server: its --slots")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="with --load: tokens of each prompt")
    parser.add_argument("--max-tokens", type=int, default=64, help="with --load: tokens generated per stream")
    parser.add_argument("--rounds", type=int, default=2, help="with --load: streams per client, one after another")
    parser.add_argument(
        "--passes", type=int, default=3, help="with --load: sweeps over every K; each K reports its median pass"
    )
    parser.add_argument("--device", default="cpu", help="with --data: the device to serve on")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each /health measurement")
    parser.add_argument("--streams", type=int, default=5, help="streams timed for TTFT and tokens/s")
    parser.add_argument("--prompt", default="The meaning of life is")
    parser.add_argument(
        "--weights",
        choices=("f32", "bf16", "f16", "q8_0", "q4_0"),
        default=None,
        help="passed to the kael-server this script starts (kael-server --weights S)",
    )
    parser.add_argument(
        "--llama-server",
        nargs="?",
        type=Path,
        const=LLAMA_SERVER,
        default=None,
        metavar="PATH",
        help=f"with --load: also sweep llama.cpp's server on the same GGUF file (default PATH: {LLAMA_SERVER})",
    )
    args = parser.parse_args()
    if args.llama_server is not None:
        if not args.load or args.url:
            parser.error("--llama-server goes with --load and --data or --random-gpt2")
        if not args.llama_server.is_file():
            parser.error(f"--llama-server: {args.llama_server} does not exist (build it: scripts/build_llama_cpp.sh)")
        if args.data is not None and args.data.suffix.lower() != ".gguf":
            parser.error("--llama-server with --data needs a .gguf file (llama.cpp reads GGUF only)")
    clients = [int(k) for k in args.clients.split(",")]

    def run(url: str) -> dict[str, Any]:
        if args.load:
            return measure_load(url, clients, args.prompt_tokens, args.max_tokens, args.rounds, args.passes)
        return measure(url, args.seconds, args.streams, args.prompt)

    batching = ["--slots", str(args.slots), "--queue", str(max(clients))] if args.load else []
    extra = batching + (["--weights", args.weights] if args.weights is not None else [])

    def side_by_side(gguf: Path, result: dict[str, Any]) -> dict[str, Any]:
        """The same sweep against llama-server on gguf (when asked for), added to kael's result."""
        if args.llama_server is None:
            return result
        with started_llama_server(args.llama_server, gguf, args.slots, gguf_context(gguf)) as url:
            theirs = sweep(url, clients, result["prompt"], result["max_tokens"], args.rounds, args.passes)
        result["llama_server"] = {"binary": str(args.llama_server), "gguf": str(gguf), "slots": args.slots, **theirs}
        ratios = {}
        for ours, other in zip(result["load"], theirs["load"]):
            if other["aggregate_tokens_per_s"]:
                ratios[str(ours["clients"])] = round(
                    ours["aggregate_tokens_per_s"] / other["aggregate_tokens_per_s"], 3
                )
        result["aggregate_kael_over_llama_server"] = ratios
        return result

    used = extra  # the flags the started kael-server got
    if args.url:
        result = run(args.url)
    elif args.data:
        with started_server(args.data, args.device, extra) as url:
            result = run(url)
        if args.llama_server is not None:
            result = side_by_side(args.data, result)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            built = Path(tmp) / "random-gpt2"
            started = time.perf_counter()
            config = random_gpt2(args.random_gpt2, built)
            config["build_s"] = round(time.perf_counter() - started, 1)
            if args.llama_server is not None:  # both servers on one GGUF file in --weights' format
                data = write_gguf(built, Path(tmp) / "random-gpt2.gguf", args.weights)
                used = batching  # the file already holds the weights in that format
            else:
                data = built
            with started_server(data, args.device, used) as url:
                result = {"random_gpt2": config, **run(url)}
            result = side_by_side(data, result)
    if args.load and not args.url:
        result["server_flags"] = used
    if not args.url:
        result["backend"] = backend_name()
    print(json.dumps(result, indent=2))


def backend_name() -> str | None:
    """The backend serving device cpu in this environment (what a started server uses too)."""
    try:
        import kael

        return str(kael.backends.current("cpu").name)
    except Exception:
        return None


if __name__ == "__main__":
    main()
