"""benchmarks/soak.py's load phases and measurements: client workers and bursts, the slot check,
/health probing, /metrics scraping and the server's resident memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from _soak_traffic import Seen, Soak, one_request, plain, stream
from kael_server.metrics import OUTCOMES  # the labels of kael_requests_total

__all__ = [
    "worker",
    "burst",
    "slot_check",
    "health_probe",
    "parse_metrics",
    "scrape",
    "requests_by_outcome",
    "wait_idle",
    "rss_sampler",
    "percentile",
    "server_log",
]


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
