"""kael-server on Ray Serve: the same Litestar app in every replica, behind Serve's HTTP proxy.

    pip install "kael-server[ray]"
    python -m kael_server.ray --num-replicas 2 --threads 1          # a local Ray instance
    python -m kael_server.ray --address auto --min-replicas 1 --max-replicas 8 --slots 4
    kael-server-ray ...                                             # the same command

Each replica runs ``load_app`` (the app ``kael-server`` serves: its routes, limits, engine
thread, metrics and drain) built by the builder function that ``serve.ingress`` calls once
per replica, so the model loads once per replica. The flags are ``kael-server``'s, plus the
Ray ones (``--address``, ``--num-replicas``, ``--min-replicas``/``--max-replicas``,
``--target-ongoing-requests``, ``--threads``, ``--num-cpus``, ``--max-queued-requests``,
``--graceful-shutdown-timeout``). Every answer carries ``x-kael-replica`` (the Serve replica
id) and every sample of ``/metrics`` a ``replica`` label with that id.

NOTE [Ray Serve replicas]
* Ready means loaded. kael's app loads its model on a thread after the ASGI start-up, and
  ``/ready`` says 503 meanwhile; Serve marks a replica running once the start-up is done,
  so ReplicaApp holds back the app's ``lifespan.startup.complete`` until the load has
  finished, and a failed load into ``lifespan.startup.failed`` (ReplicaLoadError). The replica's
  constructor then fails, Serve retries it ``max_constructor_retry_count`` times (1 here
  unless asked) and reports the deployment DEPLOY_FAILED; a replica that could not load
  never receives a request. ``check_health`` fails if the model is gone all the same.
* Capacity. ``max_ongoing_requests`` is ``slots + queue``: what one kael app admits before
  it answers 429. Beyond that the proxy holds requests (``--max-queued-requests`` of them,
  unbounded by default) and, past that, answers 429 with Retry-After itself
  (``backpressure_config``), which is kael's own contract. Autoscaling targets ``slots``
  ongoing requests per replica (``--target-ongoing-requests``): more than that means
  requests wait for a slot.
* Shutdown. When Serve stops a replica (scale-down, ``serve.delete``, ``serve.shutdown``) its
  proxy stops routing to it and waits for the requests under way to finish, then runs the
  app's ASGI shutdown, which is kael's drain (refuse new work, stop what still runs, wait
  for the engine to go idle) as on SIGTERM. Serve kills the replica after
  ``graceful_shutdown_timeout_s``, so the default is the longest a generation may run (its
  ``--request-timeout``, else the drain time) plus the drain time: with
  ``--request-timeout`` set no generation is ever cut by the kill.
* Threads. ``--threads`` is ``kael.set_num_threads`` in each replica (set before the model
  loads); ``--num-cpus`` (default: the threads) is what Ray reserves for the replica, so a
  node never runs more kernel threads than it has cores.
* Metrics. Prometheus scrapes one replica per GET through the proxy; the ``replica`` label
  keeps each replica's series apart (the registry is kael's own, re-labelled as it is
  rendered, so the counts keep their meaning per replica).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from litestar import Litestar
from litestar.types import Message, Receive, Scope, Send
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kael_server.errors import ServerConfigError
from kael_server.ray_config import APP_NAME, RayCluster, RayServeConfig, build_parser, deployment_options
from kael_server.state import ServerState

__all__ = [
    "APP_NAME",
    "REPLICA_HEADER",
    "REPLICA_LABEL",
    "SLOW_MACHINE_ENV",
    "KaelReplica",
    "RayCluster",
    "RayServeConfig",
    "ReplicaApp",
    "ReplicaLoadError",
    "build_parser",
    "build_replica_app",
    "deployment",
    "deployment_options",
    "labelled_metrics",
    "main",
]

#: Ray Serve's proxy start-up and health-check timeouts (seconds), raised to 60 unless already set.
SLOW_MACHINE_ENV = ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S")

REPLICA_HEADER = "x-kael-replica"
"""Response header naming the Serve replica that answered."""
REPLICA_LABEL = "replica"
"""Label added to every sample of ``/metrics`` under Ray Serve."""
_LOAD_POLL_SECONDS = 0.05


class _Relabelled(Collector):
    """Every family of ``registry`` with ``label=value`` added to each sample."""

    def __init__(self, registry: CollectorRegistry, label: str, value: str) -> None:
        self.registry, self.label, self.value = registry, label, value

    def collect(self) -> Iterable[Metric]:
        for family in self.registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            for s in family.samples:
                out.add_sample(s.name, {**s.labels, self.label: self.value}, s.value, s.timestamp, s.exemplar)
            yield out


def labelled_metrics(registry: CollectorRegistry, replica: str) -> bytes:
    """``registry`` in Prometheus' text format, each sample labelled ``replica="<replica>"``."""
    relabelled = CollectorRegistry(auto_describe=False)
    relabelled.register(_Relabelled(registry, REPLICA_LABEL, replica))
    return generate_latest(relabelled)


class ReplicaLoadError(ServerConfigError):
    """A replica's model failed to load: its start-up fails (the message says why)."""


class ReplicaApp:
    """ASGI wrapper of one replica's kael app (NOTE [Ray Serve replicas]).

    Adds ``x-kael-replica`` to every answer (and leaves ``x-request-id`` to Serve's proxy
    when kael took the id the proxy put on the request), the ``replica`` label to ``/metrics`` (a 200 GET
    gets the re-labelled body, a HEAD its length), and completes the lifespan start-up only
    once the model has loaded (fails it when the load failed).
    """

    def __init__(self, app: Litestar, replica: str) -> None:
        self.app = app
        self.replica = replica
        self.server: ServerState = app.state.server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._send_when_loaded(send))
        elif scope["type"] == "http":
            await self.app(scope, receive, self._send_labelled(scope, send))
        else:
            await self.app(scope, receive, send)

    def _send_when_loaded(self, send: Send) -> Send:
        async def wrapped(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                error = await self.wait_loaded()
                if error is not None:  # the app's lifespan turns it into lifespan.startup.failed
                    raise ReplicaLoadError(error)
            await send(message)

        return wrapped

    async def wait_loaded(self) -> str | None:
        """Waits for the model load to end; None when it loaded, else why it failed."""
        import asyncio

        while self.server.status == "loading":
            await asyncio.sleep(_LOAD_POLL_SECONDS)
        if self.server.load_error is not None:
            exc = self.server.load_error
            return f"kael-server replica {self.replica}: the model failed to load: {type(exc).__name__}: {exc}"
        return None

    def _send_labelled(self, scope: Scope, send: Send) -> Send:
        header = (REPLICA_HEADER.encode(), self.replica.encode("latin-1"))
        incoming = {value for name, value in scope.get("headers", []) if name == b"x-request-id"}
        method = scope.get("method")
        metrics = scope.get("path") == "/metrics" and method in ("GET", "HEAD")
        replaced = False

        async def wrapped(message: Message) -> None:
            nonlocal replaced
            if message["type"] == "http.response.start":
                # Serve's proxy appends X-Request-ID, the id kael took from the request: not twice
                headers = [h for h in message.get("headers", []) if not (h[0] == b"x-request-id" and h[1] in incoming)]
                headers.append(header)
                if metrics and message["status"] == 200:
                    body = labelled_metrics(self.server.metrics.registry, self.replica)
                    headers = [h for h in headers if h[0].lower() != b"content-length"]
                    headers.append((b"content-length", str(len(body)).encode()))
                    replaced = method == "GET"
                    await send({**message, "headers": headers})
                    if replaced:
                        await send({"type": "http.response.body", "body": body, "more_body": False})
                    return
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and replaced:
                return  # the unlabelled body: already answered with the labelled one
            await send(message)

        return wrapped


def build_replica_app(config: RayServeConfig, replica: str) -> ReplicaApp:
    """One replica's app: ``kael.set_num_threads(config.threads)``, then ``load_app`` with the
    config's ServerConfig (every ``kael-server`` setting; the model loads on its thread at
    start-up), wrapped in ReplicaApp."""
    import kael

    from kael_server.loading import load_app
    from kael_server.logs import configure_logging

    configure_logging(config.log_format, config.log_level)
    kael.set_num_threads(config.threads)
    app = load_app(config.server())
    return ReplicaApp(app, replica)


class KaelReplica:
    """The deployment class ``serve.ingress`` wraps (see ``deployment``); its ASGI app is the
    builder's ReplicaApp."""

    app: ReplicaApp  # set by Serve's ASGI wrapper from the builder's result

    def check_health(self) -> None:
        """Serve's periodic health check: fails once the replica has no model to serve."""
        server = self.app.server
        if server.load_error is not None or (server.generator is None and server.status != "loading"):
            raise RuntimeError(f"kael-server replica {self.app.replica} has no model: {server.status}")


def deployment(config: RayServeConfig, name: str = APP_NAME) -> Any:
    """The Serve deployment of ``config``: KaelReplica behind ``serve.ingress(builder)``, where
    the builder (run once in each replica) is ``build_replica_app``. ``.bind()`` it and
    ``serve.run`` the result."""
    from ray import serve

    def build() -> ReplicaApp:
        return build_replica_app(config, serve.get_replica_context().replica_tag)

    ingress = serve.ingress(build)(KaelReplica)
    return serve.deployment(ingress, name=name, **deployment_options(config))


@contextlib.contextmanager
def _until_signalled() -> Iterator[threading.Event]:
    """An Event that SIGINT or SIGTERM sets, for as long as the block runs."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Start Ray (or join ``--address``), run the deployment behind Serve's proxy on
    ``--host``:``--port``, and serve until SIGINT/SIGTERM; then delete the application
    (each replica drains) and stop what this command started. Exit 2 for a refused flag,
    1 when the deployment fails (a replica could not load the model)."""
    args = build_parser().parse_args(argv)
    try:
        from kael_server.loading import checkpoint_dir

        config = RayServeConfig.from_args(args)  # every flag checked (--port first), the API keys read
        cluster = RayCluster.from_args(args)
        if cluster.address is None:  # the replicas run here: the checkpoint must be here
            checkpoint_dir(config.data)
        import ray
        from ray import serve
    except (ServerConfigError, ImportError) as exc:
        hint = ' (pip install "kael-server[ray]")' if isinstance(exc, ImportError) else ""
        print(f"kael-server-ray: {exc}{hint}", file=sys.stderr)
        return 2
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no report to Ray's servers unless asked for
    # Serve's proxy gets 5 s to report ready by default: too little on a small, busy machine (the
    # controller then kills it and serve.start fails). A local instance's actors inherit these.
    for name in SLOW_MACHINE_ENV:
        os.environ.setdefault(name, "60")
    local = cluster.address is None
    try:
        ray.init(address=cluster.address, num_cpus=cluster.num_cpus_cluster if local else None, include_dashboard=False)
    except Exception as exc:  # no cluster at --address, a bad --num-cpus-cluster: Ray's own words
        print(f"kael-server-ray: cannot start or join Ray: {exc}", file=sys.stderr)
        return 2
    # After ray.init, whose own SIGTERM handler would replace one installed before it (and end
    # the process without a drain). A signal during the deployment stops the command once
    # serve.run has returned.
    with _until_signalled() as stop:
        try:
            serve.start(http_options={"host": config.host, "port": config.port})
            try:
                serve.run(deployment(config, cluster.name).bind(), name=cluster.name, route_prefix="/")
            except Exception as exc:  # Serve reports a failed deployment as RuntimeError (and subclasses)
                print(f"kael-server-ray: the deployment failed: {exc}", file=sys.stderr)
                return 1
            shown = f"[{config.host}]" if ":" in config.host else config.host
            print(f"kael-server-ray: serving on http://{shown}:{config.port}", file=sys.stderr, flush=True)
            while not stop.wait(0.5):  # a bounded wait: the signal handler runs between waits
                pass
            serve.delete(cluster.name)  # replicas drain (NOTE [Ray Serve replicas])
            return 0
        finally:
            if local:
                serve.shutdown()
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
