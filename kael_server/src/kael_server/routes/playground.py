"""GET /: the playground, one self-contained HTML page (no build step, no external assets).

The page itself needs no API key: when the server asks for one (a 401), the page asks the
user and sends it with every request it makes.
"""

from __future__ import annotations

import importlib.resources
from functools import cache

from litestar import MediaType, Response, get

__all__ = ["playground"]


@cache
def _page() -> str:
    return (importlib.resources.files("kael_server") / "playground.html").read_text(encoding="utf-8")


@get("/", include_in_schema=False, sync_to_thread=False, opt={"auth": "open"})
def playground() -> Response[str]:
    """The playground page: prompt, settings, streamed text, tokens/s, a stop button."""
    return Response(_page(), media_type=MediaType.HTML, headers={"Cache-Control": "no-cache"})
