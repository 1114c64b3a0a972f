"""The Ray Serve deployment's configuration and flags (``python -m kael_server.ray``), without Ray.

RayServeConfig is ServerConfig (every ``kael-server`` flag, declared once in kael_server.config)
plus the settings of Serve's replicas; RayCluster holds the command's own (which cluster, which
application name). Both are declared as ServerConfig is (kael_server.settings), so the parser,
the checks and the docs come from the same declaration: a flag ``kael-server`` gains reaches
the replicas with nothing written here.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from kael_server import limits
from kael_server.config import ServerConfig
from kael_server.settings import Flag, Integer, Number, Text, add_arguments, build_from_args, setting, settings_of

__all__ = ["APP_NAME", "RayCluster", "RayServeConfig", "build_parser", "deployment_options"]

APP_NAME = "kael"


@dataclass(frozen=True, kw_only=True)
class RayServeConfig(ServerConfig):
    """What each replica serves (ServerConfig: ``kael-server``'s flags) and how Serve runs the replicas.

    ``num_replicas`` replicas, or, with ``max_replicas``, autoscaling from ``min_replicas`` to
    ``max_replicas`` on ``target_ongoing_requests`` per replica (default: ``slots``).
    ``num_cpus`` (default: ``threads``) is Ray's reservation per replica.
    ``graceful_shutdown_timeout_s`` defaults to (``request_timeout`` or the drain time) plus
    the drain time (NOTE [Ray Serve replicas] in kael_server.ray). ServerConfigError names a bad value.
    """

    num_replicas: int = setting(
        1, Flag("--num-replicas", "replicas (without --max-replicas)", metavar="N"), rule=Integer(1, strict=False)
    )
    min_replicas: int = setting(
        1, Flag("--min-replicas", "with --max-replicas: the fewest", metavar="N"), rule=Integer(0, strict=False)
    )
    max_replicas: int | None = setting(
        None,
        Flag("--max-replicas", "autoscale up to N replicas on ongoing requests", metavar="N"),
        rule=Integer(1, strict=False),
        optional=True,
    )
    target_ongoing_requests: float | None = setting(
        None,
        Flag(
            "--target-ongoing-requests",
            "autoscaling target of ongoing requests per replica (default: --slots)",
            metavar="R",
        ),
        rule=Number(),
        optional=True,
    )
    threads: int = setting(
        1, Flag("--threads", "kael CPU threads per replica", metavar="T"), rule=Integer(1, strict=False)
    )
    num_cpus: float | None = setting(
        None,
        Flag("--num-cpus", "Ray CPUs reserved per replica (default: --threads)", metavar="C"),
        rule=Number(),
        optional=True,
    )
    max_queued_requests: int = setting(
        -1,
        Flag(
            "--max-queued-requests",
            "requests the proxy holds for busy replicas; beyond, 429 with Retry-After (-1: no limit)",
            metavar="Q",
        ),
        rule=Integer(-1, strict=False),
    )
    graceful_shutdown_timeout_s: float | None = setting(
        None,
        Flag(
            "--graceful-shutdown-timeout",
            "seconds a stopping replica may take before Ray kills it (default: --request-timeout or 30, plus 30)",
            metavar="S",
        ),
        rule=Number(),
        optional=True,
    )
    max_constructor_retry_count: int = setting(1, rule=Integer(1))  # Python only: Serve's retries of a replica

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_replicas is not None:
            Integer(max(1, self.min_replicas)).check("--max-replicas", self.max_replicas)

    @property
    def cpus(self) -> float:
        """Ray CPUs reserved per replica."""
        return float(self.threads) if self.num_cpus is None else float(self.num_cpus)

    @property
    def target(self) -> float:
        """Ongoing requests per replica the autoscaler aims at."""
        return float(self.slots) if self.target_ongoing_requests is None else float(self.target_ongoing_requests)

    @property
    def shutdown_timeout(self) -> float:
        """Seconds Serve gives a stopping replica before it kills it."""
        if self.graceful_shutdown_timeout_s is not None:
            return float(self.graceful_shutdown_timeout_s)
        longest = self.request_timeout if self.request_timeout is not None else limits.SHUTDOWN_DRAIN_SECONDS
        return float(longest) + limits.SHUTDOWN_DRAIN_SECONDS


@dataclass(frozen=True, kw_only=True)
class RayCluster:
    """The command's own settings: the Ray cluster it joins or starts, and the application's name."""

    address: str | None = setting(
        None,
        Flag(
            "--address",
            "Ray cluster to join ('auto', or HOST:PORT of its GCS); default: start a local Ray instance",
        ),
        rule=Text(),
        optional=True,
    )
    name: str = setting(APP_NAME, Flag("--name", "Serve application (and deployment) name"), rule=Text())
    num_cpus_cluster: int | None = setting(
        None,
        Flag(
            "--num-cpus-cluster",
            "CPUs of the local Ray instance (without --address; default: all)",
            metavar="C",
        ),
        rule=Integer(0, strict=False),
        optional=True,
    )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RayCluster:
        """The cluster settings of parsed flags (ServerConfigError for a bad value)."""
        return build_from_args(cls, args)


def _ray_only() -> list[str]:
    """RayServeConfig's own settings (not ServerConfig's), in declaration order."""
    server = {f.name for f, _ in settings_of(ServerConfig)}
    return [f.name for f, _ in settings_of(RayServeConfig) if f.name not in server]


def build_parser() -> argparse.ArgumentParser:
    """``kael-server``'s flags (``--port`` and ``--host`` are the Serve proxy's), plus Ray's."""
    from kael_server.cli import build_parser as server_parser

    parser = server_parser()
    parser.prog = "python -m kael_server.ray"
    parser.description = "Serve kael-server's application on Ray Serve: one or many replicas behind Serve's proxy."
    ray = parser.add_argument_group("Ray Serve")
    add_arguments(ray, RayCluster, ("address", "name"))
    add_arguments(ray, RayServeConfig, _ray_only())
    add_arguments(ray, RayCluster, ("num_cpus_cluster",))
    return parser


def deployment_options(config: RayServeConfig) -> dict[str, Any]:
    """The ``serve.deployment`` options for ``config`` (NOTE [Ray Serve replicas] in kael_server.ray)."""
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": config.cpus},
        "max_ongoing_requests": config.slots + config.queue,
        "max_queued_requests": config.max_queued_requests,
        "graceful_shutdown_wait_loop_s": 0.5,
        "graceful_shutdown_timeout_s": config.shutdown_timeout,
        "max_constructor_retry_count": config.max_constructor_retry_count,
    }
    if config.max_queued_requests >= 0:
        options["backpressure_config"] = {"status_code": 429, "retry_after_s": limits.RETRY_AFTER_SECONDS}
    if config.max_replicas is None:
        options["num_replicas"] = config.num_replicas
    else:
        options["autoscaling_config"] = {
            "min_replicas": config.min_replicas,
            "max_replicas": config.max_replicas,
            "target_ongoing_requests": config.target,
        }
    return options
