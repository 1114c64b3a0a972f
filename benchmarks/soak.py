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
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
from _soak_measure import (
    burst,
    health_probe,
    percentile,
    requests_by_outcome,
    rss_sampler,
    scrape,
    server_log,
    slot_check,
    wait_idle,
    worker,
)
from _soak_traffic import MIX, SIGTERM_MIX, Seen, Soak
from kael_server.metrics import OUTCOMES  # the labels of kael_requests_total

ROOT = Path(__file__).resolve().parents[1]


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
