"""ServerState: what one app serves (a Generator, possibly still loading) and its lifecycle."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import anyio.to_thread

from kael_server import limits
from kael_server.errors import NotReady
from kael_server.generator import Generator
from kael_server.logs import get_logger
from kael_server.metrics import Metrics

__all__ = ["Loader", "ServerState"]

Loader = Callable[[Metrics], Generator]
"""Builds the Generator (loads weights); runs on a thread so the server answers meanwhile."""


class ServerState:
    """Holds the Generator once it is loaded and drives start-up and the shutdown drain.

    Everything here runs on the event loop, except ``loader`` (on its own thread).
    ``request_timeout`` is ``--request-timeout`` (seconds from arrival; None: no limit),
    which the generation routes arm for each job (kael_server.deadline).
    """

    def __init__(
        self,
        metrics: Metrics,
        generator: Generator | None = None,
        loader: Loader | None = None,
        on_load_error: Callable[[BaseException], None] | None = None,
        request_timeout: float | None = None,
    ) -> None:
        if (generator is None) == (loader is None):
            raise ValueError("ServerState needs exactly one of generator or loader")
        self.metrics = metrics
        self.request_timeout = request_timeout
        self.generator = generator
        self.loader = loader
        self.on_load_error = on_load_error
        self.load_error: BaseException | None = None
        self.draining = False

    @property
    def status(self) -> str:
        """ "ready", "loading", "failed" or "draining"."""
        if self.draining:
            return "draining"
        if self.load_error is not None:
            return "failed"
        return "loading" if self.generator is None else "ready"

    def require(self) -> Generator:
        """The Generator, if it can take work now; NotReady (503) otherwise."""
        if self.draining:
            raise NotReady("the server is shutting down")
        if self.generator is None:
            raise NotReady("the model is not loaded")
        return self.generator

    def begin_drain(self) -> None:
        """Stops admitting work and cancels running generations (streams end with an error event)."""
        self.draining = True
        if self.generator is not None:
            self.generator.begin_shutdown()

    async def startup(self) -> None:
        """Lifespan start-up: load the model on a thread if needed; an app that was shut down
        (a test client reused, for one) takes work again."""
        self.draining = False
        if self.generator is not None:
            self.generator.shutting_down.clear()
        elif self.loader is not None:
            loop = asyncio.get_running_loop()
            threading.Thread(target=self._load, args=(self.loader, loop), name="kael-load", daemon=True).start()

    async def shutdown(self) -> None:
        """Lifespan shutdown: drain, then wait up to 30 s for the generation slot."""
        self.begin_drain()
        if self.generator is not None:
            idle = await anyio.to_thread.run_sync(self.generator.scheduler.wait_idle, limits.SHUTDOWN_DRAIN_SECONDS)
            if not idle:
                get_logger().warning("shutdown_timeout", seconds=limits.SHUTDOWN_DRAIN_SECONDS)

    def _load(self, loader: Loader, loop: asyncio.AbstractEventLoop) -> None:
        try:
            generator = loader(self.metrics)
        except Exception as exc:
            get_logger().error("model_load_failed", exc_info=exc)
            loop.call_soon_threadsafe(self._load_failed, exc)
        else:
            loop.call_soon_threadsafe(self._loaded, generator)

    def _loaded(self, generator: Generator) -> None:
        self.generator = generator
        if self.draining:
            generator.begin_shutdown()
        get_logger().info("model_loaded", model=generator.model_name, device=generator.device)

    def _load_failed(self, exc: BaseException) -> None:
        self.load_error = exc
        if self.on_load_error is not None:
            self.on_load_error(exc)
