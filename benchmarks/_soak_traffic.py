"""benchmarks/soak.py's traffic: the request kinds of the mix, their bodies, and the checks of each answer.

``Soak`` holds one run's shared state and ``Seen`` one request as its client saw it; each request
coroutine sends one kind of request (plain, streamed, cancelled, reset, abandoned, malformed, ...)
and classifies its answer against the documented ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from kael_server.limits import MAX_BODY_BYTES, MAX_OPENAI_BODY_BYTES  # bodies over them: 413 before parsing

__all__ = [
    "PROMPTS",
    "PLAIN_KINDS",
    "MIX",
    "SIGTERM_MIX",
    "ROUTE",
    "Seen",
    "Soak",
    "plain",
    "stream",
    "reset_stream",
    "abandon_plain",
    "bad_body",
    "one_request",
]

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
