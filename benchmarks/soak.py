"""Soak test of kael-server: mixed traffic from 8 to 16 clients, then a SIGTERM during load.

    python benchmarks/soak.py --duration 600                     # the bundled kael-tiny, --slots 8
    python benchmarks/soak.py --duration 90 --clients 8..16 --data kael-tiny-chat
    python benchmarks/soak.py --duration 300 --random-gpt2 2,2,64,256

It starts ``kael-server --slots 8 --queue 8`` (JSON logs to a file), warms it up, then runs
``--duration`` seconds of traffic from a number of asyncio clients that cycles between the two
ends of ``--clients``: ``/generate``, ``/v1/completions`` and ``/v1/chat/completions``, plain and
streamed; streams cancelled by the client after a few events and connections reset (RST) in
the middle of a stream; plain requests abandoned while they run; malformed, oversized and
past-the-context bodies; and every ``--burst-every`` seconds a burst of more requests than the
slots and the queue hold. Meanwhile a separate process polls ``/health`` (its latency is not
inflated by the clients' own event loop), the server's resident memory is sampled, and
``/metrics`` is scraped. After the traffic a slot check starts ``--slots`` long streams at once
(all must be running together), then ``/metrics`` is compared with what the clients saw, and
finally the traffic starts again and the server gets SIGTERM in the middle of it.

Invariants (each a key of ``invariants`` in the JSON report; the exit status is 1 if any fails):

* ``answers_complete``: every request the server accepted got its complete, well-formed answer
  (a plain body with its tokens, or a stream ending in ``[DONE]``) or one of the documented
  errors (400/422 invalid, 413 too large or past the context, 429 with ``Retry-After``, 503
  shutting down, or a stream's error event then ``[DONE]``); no transport error, no other status.
* ``per_request_outcomes``: each request's outcome in the server's log (by its X-Request-ID)
  is the one its client saw (a request its client left may have finished, or been refused, before
  the server noticed: ``ok``, ``busy`` or ``rejected`` then; one closed before the server read it
  has no log line).
* ``metrics_match_clients``: the change of ``kael_requests_total{status}`` over the run equals
  the clients' count for each outcome (the requests their clients left counted as the server's log
  resolved them, as above).
* ``in_flight_zero``, ``queue_empty``, ``kv_blocks_released``: ``kael_requests_in_flight``
  and ``kael_queue_depth`` back to 0, ``kael_kv_blocks_used`` (when exported) too.
* ``no_slot_leaked``: ``--slots`` long streams started together all run at once (each got its
  first event before any finished).
* ``burst_refused``: the bursts got 429s with ``Retry-After`` (and nothing worse).
* ``rss_growth``: resident memory at the end of the traffic is less than ``--rss-growth-pct``
  (5) percent above its level after the warm-up (medians of the first and last tenth).
* ``health_p99``: ``/health`` p99 under ``--health-p99-ms`` (50) while the traffic runs.
* ``sigterm_nothing_lost``: after SIGTERM during load every request the server accepted
  completed or got "server shutting down" (a 503, or a stream's error event and ``[DONE]``);
  requests it never accepted failed to connect; ``sigterm_exit_zero``: the process exited 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from kael_server.limits import MAX_BODY_BYTES, MAX_OPENAI_BODY_BYTES  # bodies over them: 413 before parsing
from kael_server.metrics import OUTCOMES  # the labels of kael_requests_total

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = (
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n",
    "class Parser:\n    def ",
    "for i in range(10):\n    ",
    "# a small helper\ndef load(path):\n",
    "if __name__ == '__main__':\n",
    "return [x for x in ",
    "try:\n    value = ",
)
PLAIN_KINDS = ("generate", "completions", "chat")
# kind -> weight of the traffic mix
MIX = {
    "generate": 12,
    "generate_stream": 12,
    "completions": 10,
    "completions_stream": 10,
    "chat": 4,
    "chat_stream": 4,
    "cancel_stream": 8,
    "reset_stream": 5,
    "abandon_plain": 5,
    "malformed": 6,
    "oversized": 3,
    "past_context": 5,
}
SIGTERM_MIX = {"generate": 1, "generate_stream": 1, "completions": 1, "completions_stream": 1}
ROUTE = {"generate": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass
class Seen:
    """One request as its client saw it."""

    rid: str
    kind: str
    route: str
    phase: str
    cls: str = "lost"
    """ok, busy (429 + Retry-After), rejected (400/413/422), shutdown (503 or a stream's error event "server
    shutting down"), cancelled (by this client), refused (never connected), lost, invalid (anything else)."""
    status: int | None = None
    detail: str = ""
    started: float = 0.0
    ended: float = 0.0
    first_event: float | None = None
    events: int = 0


@dataclass
class Soak:
    """Shared state of one run."""

    url: str
    context: int
    rng: random.Random
    chat_ok: bool
    seen: list[Seen] = field(default_factory=list)
    counter: int = 0
    phase: str = "warmup"

    def new(self, kind: str, route: str) -> Seen:
        self.counter += 1
        s = Seen(f"soak-{self.phase}-{self.counter}", kind, route, self.phase, started=time.time())
        self.seen.append(s)
        return s


# --------------------------------------------------------------------------------------------------
# Request bodies and answers.
# --------------------------------------------------------------------------------------------------
def _body(
    soak: Soak, base: str, stream: bool, max_tokens: int, long: bool = False, n: int | None = None
) -> dict[str, Any]:
    """A valid request; `long`: with ignore_eos (OpenAI routes), so it runs all max_tokens."""
    rng = soak.rng
    prompt = rng.choice(PROMPTS)
    temperature = rng.choice((0.0, 0.8))
    if base == "generate":
        return {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "stream": stream}
    common: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, "stream": stream}
    if long:
        common["ignore_eos"] = True
    if rng.random() < 0.5:
        common["seed"] = rng.randrange(1 << 30)
    if base == "completions":
        return {"prompt": prompt, "n": n or rng.choice((1, 1, 2)), **common}
    return {"messages": [{"role": "user", "content": prompt}], **common}


def _documented_error(base: str, status: int, headers: httpx.Headers, body: Any) -> str | None:
    """The client class of a documented error answer, or None when it is not one."""
    if base == "generate":
        if not (isinstance(body, dict) and isinstance(body.get("detail"), str)):
            return None
        message = body["detail"]
    else:
        err = body.get("error") if isinstance(body, dict) else None
        if not (isinstance(err, dict) and isinstance(err.get("message"), str) and isinstance(err.get("type"), str)):
            return None
        message = err["message"]
    if status == 429:
        return "busy" if headers.get("retry-after", "").isdigit() else None
    if status in (400, 413, 422):
        if status == 422 and base != "generate" or status == 400 and base == "generate":
            return None  # /generate answers invalid bodies 422, the OpenAI routes 400
        return "rejected"
    if status == 503 and "shutting down" in message:
        return "shutdown"
    return None


def _check_plain(base: str, body: Any, req: dict[str, Any]) -> str:
    """'' when body is a complete answer to req, else what is wrong."""
    try:
        if base == "generate":
            ok = isinstance(body["text"], str) and 0 <= body["tokens"] <= req["max_tokens"]
            return "" if ok else f"bad /generate answer {body!r:.200}"
        choices = body["choices"]
        n = req.get("n", 1)
        if len(choices) != n or sorted(c["index"] for c in choices) != list(range(n)):
            return f"{len(choices)} choices for n = {n}"
        for c in choices:
            if c["finish_reason"] not in ("stop", "length"):
                return f"finish_reason {c['finish_reason']!r}"
            text = c["text"] if base == "completions" else c["message"]["content"]
            if not isinstance(text, str):
                return "no text"
        used = body["usage"]["completion_tokens"]
        if not 0 <= used <= n * req["max_tokens"]:
            return f"usage.completion_tokens {used} for n = {n}, max_tokens = {req['max_tokens']}"
        if req.get("ignore_eos") and used != n * req["max_tokens"]:
            return f"ignore_eos: {used} tokens, expected {n * req['max_tokens']}"
    except (KeyError, TypeError) as e:
        return f"malformed answer ({e!r}): {body!r:.200}"
    return ""


def _stream_error(event: Any) -> str | None:
    if isinstance(event, dict) and "error" in event:
        err = event["error"]
        return err if isinstance(err, str) else str(err.get("message")) if isinstance(err, dict) else str(err)
    return None


def _check_event(base: str, event: Any) -> str:
    try:
        if base == "generate":
            return "" if isinstance(event["text"], str) else "no text"
        if event["object"] not in ("text_completion", "chat.completion.chunk"):
            return f"object {event['object']!r}"
    except (KeyError, TypeError) as e:
        return f"malformed event ({e!r}): {event!r:.200}"
    return ""


# --------------------------------------------------------------------------------------------------
# Requests.
# --------------------------------------------------------------------------------------------------
async def plain(soak: Soak, client: httpx.AsyncClient, base: str, max_tokens: int, kind: str = "") -> Seen:
    req = _body(soak, base, False, max_tokens)
    s = soak.new(kind or base, ROUTE[base])
    await _exchange(client, s, base, req)
    return s


async def _exchange(client: httpx.AsyncClient, s: Seen, base: str, req: dict[str, Any]) -> None:
    try:
        r = await client.post(s.route, json=req, headers={"X-Request-ID": s.rid})
    except httpx.ConnectError as e:
        s.cls, s.detail = "refused", repr(e)
        return
    except httpx.TransportError as e:
        s.cls, s.detail = "lost", repr(e)
        return
    finally:
        s.ended = time.time()
    s.status = r.status_code
    try:
        body = r.json()
    except ValueError:
        s.cls, s.detail = "invalid", f"status {r.status_code}, not JSON: {r.text[:200]!r}"
        return
    if r.status_code == 200:
        problem = _check_plain(base, body, req)
        s.cls, s.detail = ("invalid", problem) if problem else ("ok", "")
        return
    cls = _documented_error(base, r.status_code, r.headers, body)
    s.cls = cls or "invalid"
    s.detail = json.dumps(body)[:300]


async def stream(
    soak: Soak,
    client: httpx.AsyncClient,
    base: str,
    max_tokens: int,
    cancel_after: int | None = None,
    kind: str = "",
) -> Seen:
    """A streamed request; with cancel_after, the client closes it after that many events; a `kind`
    given (the slot check) makes it one choice running all max_tokens."""
    long = cancel_after is not None or bool(kind)
    req = _body(soak, base, True, max_tokens, long=long, n=1 if kind else None)
    s = soak.new(kind or base + ("_cancel" if cancel_after is not None else "_stream"), ROUTE[base])
    try:
        async with client.stream("POST", s.route, json=req, headers={"X-Request-ID": s.rid}) as r:
            s.status = r.status_code
            if r.status_code != 200:
                raw = await r.aread()
                try:
                    body = json.loads(raw)
                except ValueError:
                    s.cls, s.detail = "invalid", f"status {r.status_code}: {raw[:200]!r}"
                    return s
                s.cls = _documented_error(base, r.status_code, r.headers, body) or "invalid"
                s.detail = raw[:300].decode(errors="replace")
                return s
            s.cls, s.detail = "lost", "stream ended without [DONE]"
            error: str | None = None
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    s.cls = "ok" if error is None else "shutdown" if "shutting down" in error else "invalid"
                    s.detail = error or ""
                    return s
                event = json.loads(data)
                if error is not None:
                    s.cls, s.detail = "invalid", f"an event after the error event: {data[:200]}"
                    return s
                error = _stream_error(event)
                if error is None:
                    problem = _check_event(base, event)
                    if problem:
                        s.cls, s.detail = "invalid", problem
                        return s
                    s.events += 1
                    if s.first_event is None:
                        s.first_event = time.time()
                    if cancel_after is not None and s.events >= cancel_after:
                        s.cls, s.detail = "cancelled", f"closed after {s.events} events"
                        return s  # leaving the block closes the connection mid-stream
    except httpx.ConnectError as e:
        s.cls, s.detail = "refused", repr(e)
    except httpx.TransportError as e:
        s.cls, s.detail = "lost", repr(e)
    finally:
        s.ended = time.time()
    return s


async def reset_stream(soak: Soak, host: str, port: int, base: str) -> Seen:
    """A stream whose TCP connection is reset (SO_LINGER 0, so the server sees an RST) after its first events."""
    req = _body(soak, base, True, max(1, soak.context - 40), long=True)
    s = soak.new(base + "_reset", ROUTE[base])
    body = json.dumps(req).encode()
    head = (
        f"POST {s.route} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nX-Request-ID: {s.rid}\r\n\r\n"
    ).encode()
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(head + body)
        await writer.drain()
        head_bytes = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        status_line, *header_lines = head_bytes.decode("latin-1").split("\r\n")
        m = re.match(r"HTTP/1\.1 (\d+)", status_line)
        s.status = int(m.group(1)) if m else None
        hdrs = httpx.Headers([(k, v) for k, _, v in (h.partition(": ") for h in header_lines) if v])
        if s.status != 200:
            payload = await asyncio.wait_for(reader.readexactly(int(hdrs.get("content-length", "0"))), 30)
            try:
                parsed = json.loads(payload)
            except ValueError:
                parsed = None
            s.cls = _documented_error(base, s.status or 0, hdrs, parsed) or "invalid"
            s.detail = payload[:300].decode(errors="replace")
            return s
        want = soak.rng.randint(1, 3)
        seen = b""
        while seen.count(b"data: ") < want:
            chunk = await asyncio.wait_for(reader.read(4096), 60)
            if not chunk:
                s.cls, s.detail = "lost", "connection closed before the events"
                return s
            seen += chunk
            if b"data: [DONE]" in seen:
                s.cls, s.detail = "ok", "finished before the reset"
                return s
        s.first_event = time.time()
        s.cls, s.detail = "cancelled", "reset mid-stream"
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
        s.cls, s.detail = ("refused" if isinstance(e, ConnectionRefusedError) else "lost"), repr(e)
    finally:
        if writer is not None:
            sock = writer.get_extra_info("socket")
            if sock is not None and s.cls == "cancelled":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        s.ended = time.time()
    return s


async def abandon_plain(soak: Soak, client: httpx.AsyncClient, base: str) -> Seen:
    """A plain long request the client gives up on after a short while (the connection is closed)."""
    req = _body(soak, base, False, max(1, soak.context - 40), long=True)
    s = soak.new(base + "_abandon", ROUTE[base])
    task = asyncio.ensure_future(_exchange(client, s, base, req))
    done, _ = await asyncio.wait({task}, timeout=soak.rng.uniform(0.05, 0.4))
    if not done:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        s.cls, s.detail, s.ended = "cancelled", "abandoned while running", time.time()
    return s


async def bad_body(soak: Soak, client: httpx.AsyncClient, kind: str) -> Seen:
    """Malformed, oversized or past-the-context requests: all must be refused with a documented 4xx."""
    rng = soak.rng
    base = rng.choice(PLAIN_KINDS[:2] if kind == "past_context" else PLAIN_KINDS)
    s = soak.new(kind, ROUTE[base])
    key = "prompt" if base != "chat" else "messages"
    if kind == "malformed":
        content: bytes = rng.choice(
            (
                b"{not json",
                b"[1, 2, 3]",
                b'{"' + key.encode() + b'": 5, "max_tokens": "many"}',
                b'{"prompt": "x", "messages": [], "max_tokens": -3}',
                b'{"prompt": "\xff\xfe", "max_tokens": 4}',
                b"",
            )
        )
    elif kind == "oversized":
        cap = MAX_BODY_BYTES if base == "generate" else MAX_OPENAI_BODY_BYTES  # the OpenAI routes take schemas
        content = json.dumps({key: "x" * (cap + rng.randint(1, 20000)), "max_tokens": 4}).encode()
    else:  # past the context: the prompt plus max_tokens, or the prompt alone
        if rng.random() < 0.5:
            content = json.dumps({"prompt": rng.choice(PROMPTS), "max_tokens": min(512, soak.context)}).encode()
        else:
            content = json.dumps({"prompt": "word " * (soak.context * 2), "max_tokens": 1}).encode()
    try:
        r = await client.post(
            s.route, content=content, headers={"X-Request-ID": s.rid, "Content-Type": "application/json"}
        )
    except httpx.TransportError as e:
        s.cls, s.detail, s.ended = "lost", repr(e), time.time()
        return s
    s.ended, s.status = time.time(), r.status_code
    try:
        body = r.json()
    except ValueError:
        body = None
    cls = _documented_error(base, r.status_code, r.headers, body)
    expected = {"oversized": (413,), "past_context": (413,), "malformed": (400, 422)}[kind]
    s.cls = cls if cls == "rejected" and r.status_code in expected else "busy" if cls == "busy" else "invalid"
    s.detail = r.text[:300]
    return s


async def one_request(soak: Soak, client: httpx.AsyncClient, kind: str, host: str, port: int) -> Seen:
    rng = soak.rng
    short = rng.randint(1, min(48, soak.context - 40))
    if kind in PLAIN_KINDS:
        return await plain(soak, client, kind, short)
    if kind.endswith("_stream") and kind.split("_")[0] in PLAIN_KINDS:
        return await stream(soak, client, kind.split("_")[0], short)
    if kind == "cancel_stream":
        base = rng.choice(PLAIN_KINDS[:2])
        return await stream(soak, client, base, max(1, soak.context - 40), cancel_after=rng.randint(1, 4))
    if kind == "reset_stream":
        return await reset_stream(soak, host, port, rng.choice(PLAIN_KINDS[:2]))
    if kind == "abandon_plain":
        return await abandon_plain(soak, client, rng.choice(PLAIN_KINDS[:2]))
    return await bad_body(soak, client, kind)


# --------------------------------------------------------------------------------------------------
# Load phases.
# --------------------------------------------------------------------------------------------------
def _client(url: str, keepalive: bool = True) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=8, max_keepalive_connections=8 if keepalive else 0)
    return httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120.0), limits=limits)


async def worker(
    soak: Soak, index: int, lo: int, hi: int, end: float, period: float, mix: dict[str, int], stop: asyncio.Event
) -> None:
    """Client `index`: active while the number of active clients (cycling lo..hi..lo) exceeds it."""
    parsed = httpx.URL(soak.url)
    host, port = parsed.host, parsed.port or 80
    kinds, weights = list(mix), list(mix.values())
    async with _client(soak.url, keepalive=soak.phase != "sigterm") as client:
        while time.time() < end and not stop.is_set():
            steps = 2 * (hi - lo) or 1
            k = int(time.time() / period) % steps
            active = lo + (k if k <= hi - lo else steps - k)
            if index >= active:
                await asyncio.sleep(0.2)
                continue
            s = await one_request(soak, client, soak.rng.choices(kinds, weights)[0], host, port)
            if s.cls == "busy":
                await asyncio.sleep(0.05)
            if soak.phase == "sigterm" and s.cls in ("refused", "lost"):
                return  # the server has gone: this client stops


async def burst(soak: Soak, count: int) -> list[Seen]:
    """`count` long plain requests at once, each on its own connection."""
    async with httpx.AsyncClient(
        base_url=soak.url, timeout=httpx.Timeout(120.0), limits=httpx.Limits(max_connections=count)
    ) as client:
        long = max(1, soak.context - 40)
        return list(await asyncio.gather(*(plain(soak, client, "generate", long, "burst") for _ in range(count))))


async def slot_check(soak: Soak, slots: int) -> dict[str, Any]:
    """`slots` long streams at once: with no slot leaked each gets its first event before any finishes."""
    async with httpx.AsyncClient(
        base_url=soak.url, timeout=httpx.Timeout(120.0), limits=httpx.Limits(max_connections=slots)
    ) as client:
        long = soak.context - 40
        ss = await asyncio.gather(*(stream(soak, client, "completions", long, kind="slot_check") for _ in range(slots)))
    firsts = [s.first_event for s in ss]
    ok = all(s.cls == "ok" for s in ss) and all(f is not None for f in firsts)
    together = ok and max(f for f in firsts if f is not None) < min(s.ended for s in ss)
    return {"streams": slots, "all_ok": ok, "all_running_at_once": bool(together), "classes": [s.cls for s in ss]}


# --------------------------------------------------------------------------------------------------
# Measurements.
# --------------------------------------------------------------------------------------------------
def health_probe(url: str, out: str, stop: Any, interval: float) -> None:
    """In its own process: GET /health in a loop, writing (time, seconds, status) rows as JSON at the end."""
    rows: list[tuple[float, float, int]] = []
    with httpx.Client(base_url=url, timeout=10.0) as client:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                status = client.get("/health").status_code
            except httpx.TransportError:
                status = 0
            rows.append((time.time(), time.perf_counter() - t0, status))
            stop.wait(interval)
    Path(out).write_text(json.dumps(rows))


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (samples only)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def scrape(url: str) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        r = await client.get("/metrics")
        r.raise_for_status()
        return parse_metrics(r.text)


def requests_by_outcome(m: dict[str, float]) -> dict[str, int]:
    return {o: int(m.get(f'kael_requests_total{{status="{o}"}}', 0)) for o in OUTCOMES}


async def wait_idle(url: str, seconds: float = 60.0) -> dict[str, float]:
    """Scrapes /metrics until no request is in flight or queued (or the time is up); the last scrape."""
    deadline = time.monotonic() + seconds
    while True:
        m = await scrape(url)
        idle = m.get("kael_requests_in_flight", 0) == 0 and m.get("kael_queue_depth", 0) == 0
        if idle or time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.2)


async def rss_sampler(pid: int, samples: list[tuple[float, int]], stop: asyncio.Event) -> None:
    proc = psutil.Process(pid)
    while not stop.is_set():
        with contextlib.suppress(psutil.Error):
            samples.append((time.time(), proc.memory_info().rss))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def server_log(path: Path) -> dict[str, dict[str, Any]]:
    """request_id -> the server's 'request' log line (JSON logs)."""
    out = {}
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            d = json.loads(line)
            if isinstance(d, dict) and d.get("event") == "request" and "request_id" in d:
                out[d["request_id"]] = d
    return out


# --------------------------------------------------------------------------------------------------
# The run.
# --------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(args: argparse.Namespace, data: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    exe = shutil.which("kael-server")
    command = [exe] if exe else [sys.executable, "-m", "kael_server.cli"]
    command += ["--port", str(port), "--slots", str(args.slots), "--queue", str(args.queue)]
    command += ["--queue-timeout", str(args.queue_timeout), "--log-format", "json", "--device", args.device]
    if data:
        command += ["--data", data]
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)


async def wait_ready(url: str, proc: subprocess.Popen[bytes], seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=2.0) as client:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"kael-server exited with {proc.returncode} before it was ready")
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/ready")).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError("kael-server did not become ready")
            await asyncio.sleep(0.2)


async def run_phase(soak: Soak, phase: str, seconds: float, lo: int, hi: int, mix: dict[str, int], args: Any) -> None:
    soak.phase = phase
    stop = asyncio.Event()
    end = time.time() + seconds
    tasks = [asyncio.ensure_future(worker(soak, i, lo, hi, end, args.cycle, mix, stop)) for i in range(hi)]
    if phase == "main" and args.burst_every > 0:
        while time.time() + args.burst_every < end:
            await asyncio.sleep(args.burst_every)
            await burst(soak, args.slots + args.queue + args.burst_extra)
    await asyncio.gather(*tasks)


def _expected_outcome(s: Seen) -> set[str]:
    """The server outcomes (kael_requests_total labels) consistent with what the client saw."""
    return {
        "ok": {"ok"},
        "busy": {"busy"},
        "rejected": {"rejected"},
        # a generation stopped by the drain is "cancelled", one refused while draining (NotReady) "error"
        "shutdown": {"cancelled", "error"},
        # a request may finish, or be refused, before its client's leaving is noticed
        "cancelled": {"cancelled", "ok", "busy", "rejected"},
    }.get(s.cls, set())


async def soak_run(args: argparse.Namespace) -> dict[str, Any]:
    lo, hi = args.clients
    tmp = Path(tempfile.mkdtemp(prefix="kael-soak-"))
    data = args.data or ""
    model_info: dict[str, Any] = {}
    if args.random_gpt2:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from server import TOKENIZER, random_gpt2  # benchmarks/server.py

        ckpt = tmp / "random-gpt2"
        model_info = random_gpt2(args.random_gpt2, ckpt)
        for name in ("vocab.json", "merges.txt"):
            shutil.copyfile(TOKENIZER / name, ckpt / name)
        data = str(ckpt)
    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp / "server.log"
    proc = start_server(args, data, port, log)
    report: dict[str, Any] = {
        "config": {
            "duration_s": args.duration,
            "clients": [lo, hi],
            "slots": args.slots,
            "queue": args.queue,
            "model": data or "kael-tiny (bundled default)",
            "seed": args.seed,
            "cpus": os.cpu_count(),
            "load_average_at_start": round(os.getloadavg()[0], 2),
        }
    }
    probe_stop = multiprocessing.get_context("spawn").Event()
    probe = None
    try:
        await wait_ready(url, proc)
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as c:
            models = (await c.get("/v1/models")).json()["data"][0]
            context = int(models["max_model_len"])
            chat = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        report["config"]["model_id"], report["config"]["context"] = models["id"], context
        report["config"]["chat_template"] = chat.status_code == 200
        if model_info:
            report["config"]["random_gpt2"] = model_info
        soak = Soak(url, context, random.Random(args.seed), chat.status_code == 200)
        samples: list[tuple[float, int]] = []
        rss_stop = asyncio.Event()
        rss_task = asyncio.ensure_future(rss_sampler(proc.pid, samples, rss_stop))
        ctx = multiprocessing.get_context("spawn")
        probe_out = str(tmp / "health.json")
        probe = ctx.Process(target=health_probe, args=(url, probe_out, probe_stop, args.health_interval), daemon=True)
        probe.start()

        warm = args.warmup if args.warmup is not None else max(15.0, min(60.0, 0.1 * args.duration))
        await run_phase(soak, "warmup", warm, lo, hi, MIX, args)
        before = await wait_idle(url)
        main_start = time.time()
        await run_phase(soak, "main", args.duration, lo, hi, MIX, args)
        main_end = time.time()
        soak.phase = "slots"
        idle_before_slots = await wait_idle(url)
        slots = await slot_check(soak, args.slots)
        after = await wait_idle(url)
        rss_stop.set()
        await rss_task
        probe_stop.set()
        probe.join(30)

        # -- the counts: clients, the server's log, /metrics ------------------------------------------
        counted = [s for s in soak.seen if s.phase in ("main", "slots")]
        logged = server_log(log)
        client_counts = Counter(s.cls for s in counted)
        by_kind: dict[str, Counter[str]] = {}
        for s in counted:
            by_kind.setdefault(s.kind, Counter())[s.cls] += 1
        # each request's server outcome (its log line) must fit what its client saw; the clients'
        # count by outcome is then the server's outcome of each request the client left early
        mismatched = []
        cancelled_as: Counter[str] = Counter()  # server outcome of the requests their clients left
        expected = Counter({o: 0 for o in OUTCOMES})
        for s in counted:
            server = logged.get(s.rid, {}).get("outcome")
            if s.cls == "cancelled" and server is None:
                cancelled_as["never_reached_server"] += 1  # closed before the server read the request
                continue
            if server not in _expected_outcome(s):
                mismatched.append({"rid": s.rid, "kind": s.kind, "client": s.cls, "server": server, "detail": s.detail})
                continue
            if s.cls == "cancelled":
                cancelled_as[server] += 1
            expected[server if s.cls in ("cancelled", "shutdown") else s.cls] += 1
        delta = {o: requests_by_outcome(after)[o] - requests_by_outcome(before)[o] for o in OUTCOMES}
        bad = [asdict(s) for s in counted if s.cls in ("lost", "invalid", "refused", "shutdown")]
        bursts = [s for s in counted if s.kind == "burst" and s.cls == "busy"]

        # -- memory, /health ---------------------------------------------------------------------------
        main_rss = [r for t, r in samples if main_start <= t <= main_end]
        tenth = max(3, len(main_rss) // 10)
        rss_base = statistics.median(main_rss[:tenth]) if main_rss else float("nan")
        rss_end = statistics.median(main_rss[-tenth:]) if main_rss else float("nan")
        growth = 100.0 * (rss_end - rss_base) / rss_base if main_rss else float("nan")
        rows = json.loads(Path(probe_out).read_text()) if Path(probe_out).exists() else []
        loaded = [sec * 1000 for t, sec, st in rows if main_start <= t <= main_end]
        health_fail = sum(1 for t, _, st in rows if main_start <= t <= main_end and st != 200)

        report["traffic"] = {
            "requests": len(counted),
            "warmup_requests": sum(1 for s in soak.seen if s.phase == "warmup"),
            "client_seen": dict(sorted(client_counts.items())),
            "by_kind": {k: dict(sorted(v.items())) for k, v in sorted(by_kind.items())},
            "cancelled_server_outcomes": dict(sorted(cancelled_as.items())),
            "cancelled_never_reached_server": cancelled_as["never_reached_server"],
            "burst_429": len(bursts),
            "problems": bad[:20],
        }
        report["metrics"] = {
            "requests_total_delta": delta,
            "expected_from_clients": dict(expected),
            "per_request_mismatches": mismatched[:20],
            "in_flight_after": after.get("kael_requests_in_flight"),
            "queue_depth_after": after.get("kael_queue_depth"),
            "kv_blocks_used_after": after.get("kael_kv_blocks_used"),
            "in_flight_before_slot_check": idle_before_slots.get("kael_requests_in_flight"),
        }
        report["slot_check"] = slots
        report["rss"] = {
            "samples": len(main_rss),
            "after_warmup_mib": round(rss_base / 2**20, 1),
            "end_mib": round(rss_end / 2**20, 1),
            "max_mib": round(max(main_rss) / 2**20, 1) if main_rss else None,
            "growth_pct": round(growth, 2),
            "tenths_mib": [
                round(statistics.median(main_rss[i * len(main_rss) // 10 : (i + 1) * len(main_rss) // 10]) / 2**20, 1)
                for i in range(10)
                if len(main_rss) >= 10
            ],
        }
        report["health"] = {
            "samples_loaded": len(loaded),
            "p50_ms": round(percentile(loaded, 0.5), 2),
            "p99_ms": round(percentile(loaded, 0.99), 2),
            "max_ms": round(max(loaded), 2) if loaded else None,
            "non_200": health_fail,
        }

        # -- SIGTERM during load -----------------------------------------------------------------------
        soak.phase = "sigterm"
        stop = asyncio.Event()
        end = time.time() + 120
        tasks = [asyncio.ensure_future(worker(soak, i, hi, hi, end, 1.0, SIGTERM_MIX, stop)) for i in range(hi)]
        deadline = time.monotonic() + 30
        in_flight = 0.0
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            in_flight = (await scrape(url)).get("kael_requests_in_flight", 0)
            if in_flight >= args.slots:
                break
        await asyncio.sleep(0.5)
        t_sig = time.time()
        proc.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(asyncio.to_thread(proc.wait), 90)
        except asyncio.TimeoutError:
            code = None
        t_exit = time.time()
        stop.set()
        await asyncio.gather(*tasks)
        logged = server_log(log)
        sig = [s for s in soak.seen if s.phase == "sigterm"]
        lost = []
        accepted: Counter[str] = Counter()
        for s in sig:
            server = logged.get(s.rid)
            if server is None:  # never served: it must have failed to connect or been cut before being read
                if s.cls not in ("refused", "lost"):
                    lost.append({"rid": s.rid, "client": s.cls, "server": None, "detail": s.detail})
                continue
            accepted[s.cls] += 1
            # completed, or "server shutting down"; a 429 or 4xx before the signal is a documented answer too
            fine = server.get("outcome") in _expected_outcome(s) and s.cls != "cancelled"
            if not fine:
                lost.append({"rid": s.rid, "client": s.cls, "server": server.get("outcome"), "detail": s.detail})
        report["sigterm"] = {
            "in_flight_at_signal": in_flight,
            "requests": len(sig),
            "accepted": dict(accepted),
            "running_at_signal": sum(1 for s in sig if s.started < t_sig < s.ended and s.rid in logged),
            "not_accepted": sum(1 for s in sig if s.rid not in logged),
            "lost": lost[:20],
            "exit_code": code,
            "seconds_to_exit": round(t_exit - t_sig, 2),
        }
        inv = {
            "answers_complete": not bad,
            "per_request_outcomes": not mismatched,
            "metrics_match_clients": delta == dict(expected),
            "in_flight_zero": after.get("kael_requests_in_flight") == 0,
            "queue_empty": after.get("kael_queue_depth") == 0,
            "kv_blocks_released": after.get("kael_kv_blocks_used", 0) == 0,
            "no_slot_leaked": slots["all_running_at_once"],
            "burst_refused": args.burst_every <= 0 or len(bursts) > 0,
            "rss_growth": growth < args.rss_growth_pct,
            "health_p99": bool(loaded) and percentile(loaded, 0.99) < args.health_p99_ms and health_fail == 0,
            "sigterm_nothing_lost": not lost and sum(accepted.values()) > 0,
            "sigterm_exit_zero": code == 0,
        }
        report["invariants"] = inv
        report["config"]["load_average_at_end"] = round(os.getloadavg()[0], 2)
        report["ok"] = all(inv.values())
        report["server_log"] = str(log) if args.keep_log else None
        return report
    finally:
        probe_stop.set()
        if probe is not None and probe.is_alive():
            probe.terminate()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if not args.keep_log:
            shutil.rmtree(tmp, ignore_errors=True)


def _clients(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)(?:\.\.(\d+))?", text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected N or LO..HI, got {text!r}")
    lo = int(m.group(1))
    hi = int(m.group(2) or lo)
    if not 1 <= lo <= hi <= 256:
        raise argparse.ArgumentTypeError(f"expected 1 <= LO <= HI <= 256, got {text!r}")
    return lo, hi


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of traffic after the warm-up (120)")
    ap.add_argument("--clients", type=_clients, default=(8, 16), help="LO..HI concurrent clients (8..16)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--data", "--model", dest="data", help="kael-server --data (default: the bundled kael-tiny)")
    src.add_argument("--random-gpt2", metavar="SPEC", help="a random GPT-2 (benchmarks/server.py's SPEC)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--port", type=int, default=0, help="port for the server (default: a free one)")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--queue", type=int, default=8)
    ap.add_argument("--queue-timeout", type=float, default=5.0)
    ap.add_argument("--cycle", type=float, default=5.0, help="seconds per step of the client count cycle")
    ap.add_argument("--burst-every", type=float, default=20.0, help="seconds between bursts (0: none)")
    ap.add_argument("--burst-extra", type=int, default=8, help="a burst is slots + queue + this many requests")
    ap.add_argument(
        "--warmup", type=float, default=None, help="seconds of warm-up traffic (10%% of --duration, 15..60)"
    )
    ap.add_argument("--health-interval", type=float, default=0.05)
    ap.add_argument("--health-p99-ms", type=float, default=50.0)
    ap.add_argument("--rss-growth-pct", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep-log", action="store_true", help="keep the server's log (its path is in the report)")
    args = ap.parse_args(argv)
    report = asyncio.run(soak_run(args))
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
