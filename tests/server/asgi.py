"""Drive one HTTP request through an ASGI app by hand, on the test's event loop.

Unlike a test client, the test decides when the client disconnects and whether it reads
the response at all, as a real socket would: after the body, ``receive()`` blocks until
``disconnect()`` or the end of the response, which is what uvicorn does.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any


class Exchange:
    def __init__(
        self,
        app: Any,
        path: str,
        payload: Any = None,
        *,
        chunks: list[bytes] | None = None,
        reads: bool = True,
    ) -> None:
        """Sends ``payload`` as JSON in one message, or ``chunks`` as a chunked body."""
        self.app = app
        self.path = path
        if chunks is None:
            chunks = [payload if isinstance(payload, bytes) else json.dumps(payload).encode()]
        self.chunks = chunks
        self.reads = reads
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.received = bytearray()
        self.complete = False
        self.chunks_read = 0
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._progress = asyncio.Condition()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> Exchange:
        for i, chunk in enumerate(self.chunks):
            more = i < len(self.chunks) - 1
            self._inbox.put_nowait({"type": "http.request", "body": chunk, "more_body": more})
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": self.path,
            "raw_path": self.path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
            "client": ("127.0.0.1", 1234),
            "server": ("127.0.0.1", 80),
            "state": {},
        }
        self.task = asyncio.create_task(self.app(scope, self._receive, self._send))
        return self

    def disconnect(self) -> None:
        self._inbox.put_nowait({"type": "http.disconnect"})

    async def _receive(self) -> dict[str, Any]:
        message = await self._inbox.get()
        if message["type"] == "http.request":
            self.chunks_read += 1
        return message

    async def _send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = {k.decode(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            if not self.reads:
                await asyncio.Event().wait()  # a client that never reads: send blocks forever
            self.received += message.get("body", b"")
            self.complete = not message.get("more_body", False)
            if self.complete:  # as uvicorn: once the response is sent, receive() reports the end
                self.disconnect()
        async with self._progress:
            self._progress.notify_all()

    async def wait_until(self, predicate: Any, timeout: float = 10) -> None:
        """Waits (with a deadline) until ``predicate(self)`` holds after some message arrived."""
        async with self._progress:
            await asyncio.wait_for(self._progress.wait_for(lambda: predicate(self)), timeout)

    async def finish(self, timeout: float = 10) -> None:
        assert self.task is not None
        await asyncio.wait_for(self.task, timeout)

    def events(self) -> list[str]:
        """The ``data:`` payloads received so far."""
        return [line[len("data: ") :] for line in self.received.decode().split("\n") if line.startswith("data: ")]
