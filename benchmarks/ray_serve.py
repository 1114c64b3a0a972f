"""Benchmark kael-server on Ray Serve against kael-server alone: aggregate tokens/s under K
streaming clients, in one run, on the same model, prompt and token counts.

    python benchmarks/ray_serve.py                     # bundled kael-tiny, 8 clients
    python benchmarks/ray_serve.py --data DIR --clients 8 --max-tokens 64 --passes 3
    python benchmarks/ray_serve.py --random-gpt2 6,8,512          # a heavier model, random weights

Setups, one after another (each alone on the machine while it is measured):

* ``server_2_threads``: one ``kael-server`` process, ``KAEL_NUM_THREADS=2``;
* ``server_1_thread``: the same with 1 thread (what a replica has, without Ray's proxy);
* ``ray_1_replica`` and ``ray_2_replicas``: ``kael_server.ray`` on a local Ray instance
  (``ray.init(num_cpus=--ray-cpus)``, default 2), 1 thread and 1 Ray CPU per replica.

Every server gets ``--slots S --queue S`` (S = the most clients, so every client is decoded
in the same batch when one server takes them all). The load is benchmarks/server.py's load
mode (its light asyncio SSE client, greedy streamed /v1/completions, ``--rounds`` streams per
client, the median of ``--passes`` passes). Prints one JSON object: each setup's result and
the ratios of aggregate tokens/s to ``server_2_threads``, and the tokens per CPU second its
server processes (Ray's included) used while measured: on a machine other work shares, wall
rates also reflect the CPU share each setup's processes won, the CPU figure does not. Only loopback addresses are used;
Ray's dashboard and usage report are off.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def load_client() -> ModuleType:
    """benchmarks/server.py (not a package): its load mode is the client of every setup here."""
    spec = importlib.util.spec_from_file_location("kael_benchmark_server", ROOT / "benchmarks" / "server.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def descendants_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of every process below this one, by pid: the kael-server
    process, or every process of the local Ray instance (GCS, raylet, controller, proxy,
    replicas). Without psutil (Ray brings it), an empty dict."""
    try:
        import psutil
    except ImportError:
        return {}
    found: dict[int, float] = {}
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            times = child.cpu_times()
            found[child.pid] = times.user + times.system
    return found


def wait_ready(url: str, alive: Any = None, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        if (alive is not None and not alive()) or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not become ready")
        time.sleep(0.1)


@contextlib.contextmanager
def kael_server(port: int, data: str | None, threads: int, batching: list[str]) -> Iterator[str]:
    """``kael-server`` with ``threads`` kernel threads, stopped by SIGTERM (its drain)."""
    command = [shutil.which("kael-server") or sys.executable]
    if command[0] == sys.executable:
        command += ["-m", "kael_server.cli"]
    command += ["--port", str(port), "--log-level", "warning", *batching]
    if data is not None:
        command += ["--data", data]
    env = {**os.environ, "KAEL_NUM_THREADS": str(threads)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, alive=lambda: process.poll() is None)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def ray_serve(port: int, cpus: int) -> Iterator[Any]:
    """A local Ray instance with Serve's proxy on ``port``; yields ``ray.serve``."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    for name in ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"):
        os.environ.setdefault(name, "60")  # the proxy's 5 s readiness check fails on a busy machine
    import ray
    from ray import serve

    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield serve
    finally:
        serve.shutdown()
        ray.shutdown()


@contextlib.contextmanager
def ray_app(serve: Any, port: int, replicas: int, data: str | None, slots: int) -> Iterator[str]:
    """``replicas`` replicas of kael-server (1 thread, 1 Ray CPU each) behind the proxy."""
    from kael_server.ray import RayServeConfig, deployment

    config = RayServeConfig(data=data, slots=slots, queue=slots, threads=1, num_cpus=1, num_replicas=replicas)
    name = f"kael-{replicas}"
    serve.run(deployment(config, name=name).bind(), name=name, route_prefix="/")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url)
        yield url
    finally:
        serve.delete(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--data", default=None, help="checkpoint directory (default: the bundled kael-tiny)")
    where.add_argument(
        "--random-gpt2",
        metavar="SPEC",
        help="serve a GPT-2 with random weights built by kael (LAYERS,HEADS,DIM[,CONTEXT], or small; "
        "benchmarks/server.py's builder, GPT-2's tokenizer)",
    )
    parser.add_argument("--clients", type=int, default=8, help="concurrent streaming clients")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="tokens of each prompt")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens generated per stream")
    parser.add_argument("--rounds", type=int, default=4, help="streams per client, one after another")
    parser.add_argument("--passes", type=int, default=3, help="passes per setup; each reports its median pass")
    parser.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the local Ray instance")
    args = parser.parse_args()
    bench = load_client()
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):  # Ray prints to stdout
        model: dict[str, Any] = {"data": args.data or "kael-tiny (bundled)"}
        if args.random_gpt2:
            built = Path(tmp) / "random-gpt2"
            model = {"random_gpt2": bench.random_gpt2(args.random_gpt2, built)}
            for name in ("vocab.json", "merges.txt"):
                shutil.copyfile(bench.TOKENIZER / name, built / name)
            args.data = str(built)
        report = run(bench, args)
    print(json.dumps({**report, "model": model}, indent=2))


def run(bench: ModuleType, args: argparse.Namespace) -> dict[str, Any]:
    """Every setup, one after another; the report without the model's description."""
    slots = args.clients
    batching = ["--slots", str(slots), "--queue", str(slots)]

    def measure(url: str) -> dict[str, Any]:
        before = descendants_cpu()
        result: dict[str, Any] = bench.measure_load(
            url, [args.clients], args.prompt_tokens, args.max_tokens, args.rounds, args.passes
        )
        after = descendants_cpu()
        (load,) = result.pop("load")
        result.pop("prompt")
        cpu = sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())
        load["server_cpu_s"] = round(cpu, 2)
        load["tokens_per_cpu_s"] = round(load["tokens"] / cpu, 2) if cpu > 0 else None
        return {**result, **load}

    results: dict[str, Any] = {}
    for threads, key in ((2, "server_2_threads"), (1, "server_1_thread")):
        with kael_server(bench.free_port(), args.data, threads, batching) as url:
            results[key] = measure(url)
    port = bench.free_port()
    with ray_serve(port, args.ray_cpus) as serve:
        for replicas, key in ((1, "ray_1_replica"), (2, "ray_2_replicas")):
            with ray_app(serve, port, replicas, args.data, slots) as url:
                results[key] = measure(url)
                results[key]["replicas"] = replicas
    base = results["server_2_threads"]["aggregate_tokens_per_s"]
    summary = {
        key: {
            "aggregate_tokens_per_s": r["aggregate_tokens_per_s"],
            "over_server_2_threads": round(r["aggregate_tokens_per_s"] / base, 3) if base else None,
            "tokens_per_cpu_s": r["tokens_per_cpu_s"],
            "errors": r["errors"],
        }
        for key, r in results.items()
    }
    return {"clients": args.clients, "slots_per_server": slots, "cpus": os.cpu_count(), "summary": summary,
            "setups": results}  # fmt: skip


if __name__ == "__main__":
    main()
