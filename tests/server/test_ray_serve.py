"""kael_server.ray: kael-server's app on Ray Serve, checked against the same app served alone.

The Ray tests start a local Ray instance (``ray.init(num_cpus=2)``, no dashboard, no usage
report), deploy 2 replicas of the bundled kael-tiny (1 thread, half a CPU each), send plain
and streaming greedy (and seeded) requests at once through Serve's HTTP proxy, and compare
every text with what one app (Litestar's test client, 1 thread) answers to the same request;
both replicas must have answered (``x-kael-replica``) and the replicas' ``/metrics``
(``replica`` label) must add up to the requests sent. A deployment whose model cannot load
must fail and never answer. The unit tests (no Ray cluster) check the options Serve gets,
the flag checks, and ReplicaApp's header, metrics labels and start-up gate.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.testing import TestClient
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

pytest.importorskip("ray.serve", reason='Ray Serve is not installed (pip install "kael-server[ray]")')

from kael_server.errors import ServerConfigError  # noqa: E402
from kael_server.loading import bundled_model_dir, load_app  # noqa: E402
from kael_server.ray import (  # noqa: E402
    REPLICA_HEADER,
    SLOW_MACHINE_ENV,
    RayCluster,
    RayServeConfig,
    ReplicaApp,
    ReplicaLoadError,
    build_parser,
    deployment,
    deployment_options,
    labelled_metrics,
)

from kael_server import limits  # noqa: E402

from .conftest import make_app, samples, sse_payloads  # noqa: E402
from .processes import free_port  # noqa: E402

PROMPTS = ["def fibonacci(n):\n", "import os\n", "class Parser:\n    def ", "for i in range(10):\n"]
MAX_TOKENS = 24


# ---- unit tests: no Ray cluster --------------------------------------------------------------


def test_deployment_options_follow_slots_threads_and_timeouts() -> None:
    fixed = deployment_options(RayServeConfig(slots=4, queue=2, threads=3, num_replicas=2))
    assert fixed["num_replicas"] == 2 and "autoscaling_config" not in fixed
    assert fixed["ray_actor_options"] == {"num_cpus": 3.0}
    assert fixed["max_ongoing_requests"] == 6  # what one kael app admits before its 429
    assert fixed["max_queued_requests"] == -1 and "backpressure_config" not in fixed
    assert fixed["graceful_shutdown_timeout_s"] == 2 * limits.SHUTDOWN_DRAIN_SECONDS
    assert fixed["max_constructor_retry_count"] == 1

    auto = deployment_options(
        RayServeConfig(slots=4, threads=2, num_cpus=0.5, min_replicas=1, max_replicas=5, request_timeout=90,
                       max_queued_requests=16)
    )  # fmt: skip
    assert "num_replicas" not in auto
    assert auto["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 5, "target_ongoing_requests": 4.0}
    assert auto["ray_actor_options"] == {"num_cpus": 0.5}
    assert auto["max_queued_requests"] == 16
    assert auto["backpressure_config"] == {"status_code": 429, "retry_after_s": limits.RETRY_AFTER_SECONDS}
    assert auto["graceful_shutdown_timeout_s"] == 90 + limits.SHUTDOWN_DRAIN_SECONDS
    explicit = deployment_options(RayServeConfig(max_replicas=2, target_ongoing_requests=1.5))
    assert explicit["autoscaling_config"]["target_ongoing_requests"] == 1.5


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"slots": 0}, "--slots must be an integer >= 1, got 0"),
        ({"threads": True}, "--threads must be an integer >= 1, got True"),
        ({"num_replicas": 1.5}, "--num-replicas must be an integer >= 1, got 1.5"),
        ({"queue": -1}, "--queue must be an integer >= 0, got -1"),
        ({"min_replicas": 3, "max_replicas": 2}, "--max-replicas must be an integer >= 3, got 2"),
        ({"max_queued_requests": -2}, "--max-queued-requests must be an integer >= -1, got -2"),
        ({"num_cpus": 0}, "--num-cpus must be a positive number, got 0"),
        ({"target_ongoing_requests": float("nan")}, "--target-ongoing-requests must be a positive number, got nan"),
        ({"graceful_shutdown_timeout_s": float("inf")}, "--graceful-shutdown-timeout must be a positive number"),
        ({"max_constructor_retry_count": 0}, "--max-constructor-retry-count must be an integer >= 1, got 0"),
        ({"slots": 2, "port": 0}, "--port must be a TCP port from 1 to 65535, got 0"),  # kael-server's, checked too
    ],
)
def test_bad_values_are_refused_with_the_flag_and_value(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(ServerConfigError, match="^" + words.replace("(", r"\(").replace(".", r"\.")):
        RayServeConfig(**changes)


def test_flags_are_kael_servers_plus_rays() -> None:
    args = build_parser().parse_args(
        ["--slots", "3", "--queue", "5", "--threads", "2", "--max-replicas", "4", "--address", "auto", "--port", "9"]
    )
    config = RayServeConfig.from_args(args)
    assert (config.slots, config.queue, config.threads, config.max_replicas, config.cpus) == (3, 5, 2, 4, 2.0)
    assert config.port == 9 and RayCluster.from_args(args) == RayCluster(address="auto")
    assert deployment_options(config)["autoscaling_config"]["target_ongoing_requests"] == 3.0
    config = RayServeConfig.from_args(build_parser().parse_args(["--kv-cache-tokens", "64", "--no-prefix-cache"]))
    assert (config.kv_cache_tokens, config.prefix_cache) == (64, False)
    with pytest.raises(ServerConfigError, match="^--num-replicas must be an integer >= 1, got 0$"):
        RayServeConfig.from_args(build_parser().parse_args(["--num-replicas", "0"]))


def test_the_replicas_get_every_kael_server_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """build_replica_app hands each replica's load_app the whole ServerConfig of the Ray config."""
    import kael
    import kael_server.loading
    from kael_server.config import ServerConfig
    from kael_server.ray import build_replica_app

    given: list[object] = []

    def load_app(config: ServerConfig) -> Any:
        given.append(config)
        return make_app()

    monkeypatch.setattr(kael_server.loading, "load_app", load_app)
    monkeypatch.setattr(kael, "set_num_threads", lambda n: given.append(("threads", n)))
    changed: dict[str, Any] = {"data": "elsewhere", "device": "cuda", "weights": "q8_0", "slots": 3, "kv_cache_tokens": 4096,
               "prefix_cache": False, "queue": 2, "queue_timeout": 1.5, "request_timeout": 60.0,
               "protect_metrics": True, "log_format": "console", "log_level": "warning"}  # fmt: skip
    build_replica_app(RayServeConfig(threads=2, **changed), "r")
    assert given[0] == ("threads", 2)
    assert given[1] == ServerConfig(**changed) and type(given[1]) is ServerConfig


def test_main_refuses_a_bad_checkpoint_before_starting_ray(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kael_server.ray import main

    assert main(["--data", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["--port", "0"]) == 2
    assert "--port must be a TCP port from 1 to 65535, got 0" in capsys.readouterr().err


def test_labelled_metrics_are_the_registry_plus_a_replica_label() -> None:
    registry = CollectorRegistry(auto_describe=True)
    counter = Counter("things", "Things.", ["kind"], registry=registry)
    counter.labels("a").inc(3)
    Gauge("level", "Level.", registry=registry).set(2.5)
    Histogram("wait_seconds", "Wait.", buckets=(0.1, 1), registry=registry).observe(0.5)
    plain = samples(generate_latest(registry).decode())
    labelled = samples(labelled_metrics(registry, "r-1").decode())
    expected = {(name, tuple(sorted(dict(labels, replica="r-1").items()))): v for (name, labels), v in plain.items()}
    assert labelled == expected
    assert labelled[("things_total", (("kind", "a"), ("replica", "r-1")))] == 3
    assert labelled[("wait_seconds_bucket", (("le", "1.0"), ("replica", "r-1")))] == 1
    families = {f.name: f.type for f in text_string_to_metric_families(labelled_metrics(registry, "x").decode())}
    assert families["things"] == "counter" and families["level"] == "gauge" and families["wait_seconds"] == "histogram"


def test_replica_app_adds_the_header_and_labels_metrics() -> None:
    app = ReplicaApp(make_app(), "abc")
    with TestClient(app) as client:  # type: ignore[arg-type]
        plain = client.post("/generate", json={"prompt": "hi", "max_tokens": 3})
        assert plain.status_code == 200 and plain.headers[REPLICA_HEADER] == "abc"
        sent = client.get("/health", headers={"x-request-id": "my-id"})
        assert sent.headers[REPLICA_HEADER] == "abc" and "x-request-id" not in sent.headers  # Serve adds it
        assert client.get("/health").headers["x-request-id"]  # kael's own id when the request had none
        metrics = client.get("/metrics")
        assert metrics.status_code == 200 and int(metrics.headers["content-length"]) == len(metrics.content)
        found = samples(metrics.text)
        assert found[("kael_requests_total", (("replica", "abc"), ("status", "ok")))] == 1
        assert all(dict(labels).get("replica") == "abc" for _, labels in found)
        head = client.head("/metrics")
        assert head.status_code == 200 and head.content == b""
        assert abs(int(head.headers["content-length"]) - len(metrics.content)) < 64  # same body but the moments


def test_replica_app_starts_only_once_the_model_loaded(tmp_path: Path) -> None:
    good = ReplicaApp(load_app(None), "good")
    with TestClient(good) as client:  # type: ignore[arg-type]
        assert good.server.status == "ready"  # the start-up waited for the load
        assert client.get("/ready").json() == {"status": "ready"}
    broken = ReplicaApp(load_app(_broken_checkpoint(tmp_path)), "bad")
    with pytest.raises(Exception) as failure, TestClient(broken):  # type: ignore[arg-type]
        pass
    (error,) = _leaves(failure.value)  # a ReplicaLoadError, inside the test client's task groups
    assert isinstance(error, ReplicaLoadError)
    assert str(error).startswith("kael-server replica bad: the model failed to load: FormatError: safetensors file")
    assert broken.server.load_error is not None and broken.server.generator is None


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups."""
    inner = getattr(exc, "exceptions", None)  # a BaseExceptionGroup (Python 3.11+, or anyio's backport)
    return [exc] if inner is None else [leaf for e in inner for leaf in _leaves(e)]


def _broken_checkpoint(tmp_path: Path) -> Path:
    """kael-tiny's files, but weights that are not a safetensors file: the load (not the
    directory check) fails."""
    broken = tmp_path / "broken"
    shutil.copytree(bundled_model_dir(), broken)
    (broken / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    return broken


# ---- Ray: a local instance, 2 replicas through Serve's proxy ----------------------------------


@pytest.mark.slow
def test_the_command_serves_and_exits_0_on_sigterm(tmp_path: Path, single: TestClient[Any]) -> None:
    """``python -m kael_server.ray`` on a local Ray instance of its own (before the module's
    instance starts): it answers as one server does, and SIGTERM ends it with status 0."""
    port = free_port()
    command = [sys.executable, "-m", "kael_server.ray", "--port", str(port), "--threads", "1", "--num-cpus", "0.5",
               "--num-cpus-cluster", "2", "--log-level", "warning"]  # fmt: skip
    log = tmp_path / "log.txt"
    body = {"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0}
    with log.open("w") as out:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **{k: "60" for k in SLOW_MACHINE_ENV}}
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 300
            while True:  # a process: nothing to wait on but its port
                assert process.poll() is None, log.read_text()[-4000:]
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=5).status_code == 200:
                        break
                assert time.monotonic() < deadline, log.read_text()[-4000:]
                time.sleep(0.2)
            answer = httpx.post(f"http://127.0.0.1:{port}/generate", json=body, timeout=120)
            assert answer.status_code == 200 and answer.headers[REPLICA_HEADER]
            assert answer.json()["text"] == single.post("/generate", json=body).json()["text"]
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=180) == 0, log.read_text()[-4000:]
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def serve_url() -> Iterator[str]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    for name in SLOW_MACHINE_ENV:  # the proxy's 5 s readiness check fails on a loaded 2-core machine
        os.environ.setdefault(name, "60")
    import ray
    from ray import serve

    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = RayServeConfig(num_replicas=2, threads=1, num_cpus=0.5)
        serve.run(deployment(config).bind(), name="kael", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def single() -> Iterator[TestClient[Any]]:
    """The same app, bundled model, 1 thread, alone: the oracle."""
    import kael

    threads = kael.get_num_threads()
    kael.set_num_threads(1)
    try:
        with TestClient(load_app(None)) as client:
            assert _wait_ready(client)
            yield client
    finally:
        kael.set_num_threads(threads)


def _wait_ready(client: TestClient[Any]) -> bool:
    from .conftest import poll_until

    return poll_until(lambda: client.get("/ready").status_code == 200, timeout=120)


def _requests() -> list[tuple[str, dict[str, Any]]]:
    """Plain and streaming, greedy and seeded: (path, body) pairs, all different."""
    out: list[tuple[str, dict[str, Any]]] = []
    for i, prompt in enumerate(PROMPTS):
        out.append(("/generate", {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}))
        out.append(
            ("/v1/completions", {"model": "kael-tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                                 "stream": True})
        )  # fmt: skip
        if i % 2:
            out.append(("/generate", {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.9, "seed": 7 + i}))
    return out


def _text(path: str, body: dict[str, Any], status: int, payload: str) -> str:
    assert status == 200, payload
    if not body.get("stream"):
        return str(json.loads(payload)["text"])
    events = sse_payloads(payload)
    assert events[-1] == "[DONE]", events[-3:]
    return "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])


@pytest.mark.slow
def test_two_replicas_answer_as_one_server(serve_url: str, single: TestClient[Any]) -> None:
    requests = _requests()
    expected = []
    before = single_tokens(single)
    for path, body in requests:
        answer = single.post(path, json=body)
        expected.append(_text(path, body, answer.status_code, answer.text))
    oracle_tokens = single_tokens(single) - before
    assert any(expected) and len(set(expected)) > 1

    got: list[tuple[str, str] | None] = [None] * len(requests)
    errors: list[BaseException] = []

    def send(i: int) -> None:
        path, body = requests[i]
        try:
            with httpx.Client(base_url=serve_url, timeout=300) as client:
                answer = client.post(path, json=body)
                got[i] = (_text(path, body, answer.status_code, answer.text), answer.headers[REPLICA_HEADER])
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    workers = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=600)
    assert not errors, errors
    assert all(g is not None for g in got)
    texts = [g[0] for g in got if g is not None]
    replicas = {g[1] for g in got if g is not None}
    assert texts == expected
    assert len(replicas) == 2, replicas  # one request a replica at a time (max_ongoing_requests 1): both worked

    # Each replica's own counts (the replica label), read through the proxy until both answered.
    counts: dict[str, float] = {}
    tokens: dict[str, float] = {}
    with httpx.Client(base_url=serve_url, timeout=120) as client:
        for _ in range(200):
            answer = client.get("/metrics")
            assert answer.status_code == 200
            replica = answer.headers[REPLICA_HEADER]
            found = samples(answer.text)
            counts[replica] = found[("kael_requests_total", (("replica", replica), ("status", "ok")))]
            tokens[replica] = found[("kael_generated_tokens_total", (("replica", replica),))]
            if len(counts) == 2:
                break
    assert set(counts) == replicas
    assert sum(counts.values()) == len(requests) and all(c >= 1 for c in counts.values())
    assert sum(tokens.values()) == oracle_tokens


def single_tokens(client: TestClient[Any]) -> float:
    """Tokens the oracle generated for the same requests (its own counter)."""
    return samples(client.get("/metrics").text)[("kael_generated_tokens_total", ())]


@pytest.mark.slow
def test_a_replica_that_cannot_load_never_serves(serve_url: str, tmp_path: Path) -> None:
    from ray import serve

    config = RayServeConfig(data=str(_broken_checkpoint(tmp_path)), threads=1, num_cpus=0.5)
    with pytest.raises(RuntimeError):
        serve.run(deployment(config, name="broken").bind(), name="broken", route_prefix="/broken")
    try:
        assert serve.status().applications["broken"].status == "DEPLOY_FAILED"
        with httpx.Client(base_url=serve_url, timeout=60) as client:
            assert client.get("/broken/ready").status_code != 200
            assert client.get("/ready").status_code == 200  # the good application still serves
    finally:
        serve.delete("broken")
