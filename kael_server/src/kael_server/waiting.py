"""Awaiting a generation job on the event loop while watching for the client to leave."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from litestar import Request

from kael_server.errors import ClientGone
from kael_server.jobs import Failed, Finished, Job

__all__ = ["accepted", "finished", "or_disconnect"]

T = TypeVar("T")


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    """Returns once the server reports ``http.disconnect`` (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def or_disconnect(request: Request[Any, Any, Any], awaitable: Awaitable[T]) -> T:
    """``await awaitable``, or raise ClientGone as soon as the client disconnects.

    The ASGI server delivers ``http.disconnect`` to a pending ``receive()`` the moment the
    connection drops, so a waiting request notices a departed client at once, not at the
    end of the generation.
    """
    task = asyncio.ensure_future(awaitable)
    listener = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        listener.cancel()
    if task.done():
        return task.result()
    task.cancel()
    raise ClientGone


async def accepted(job: Job, request: Request[Any, Any, Any]) -> None:
    """Waits until the worker has encoded and accepted the prompt; raises its error otherwise."""
    first = await or_disconnect(request, job.events.get())
    if isinstance(first, Failed):
        raise first.error


async def finished(job: Job, request: Request[Any, Any, Any]) -> Finished:
    """Waits for the whole generation; raises its error if it failed."""
    outcome = await or_disconnect(request, asyncio.shield(job.done))
    if isinstance(outcome, Failed):
        raise outcome.error
    return outcome
