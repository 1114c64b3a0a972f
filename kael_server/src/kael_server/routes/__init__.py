"""The HTTP routes of kael-server, one module per API surface."""

from __future__ import annotations

from kael_server.routes.chat import chat_completions
from kael_server.routes.generate import generate
from kael_server.routes.openai import completions, model, models
from kael_server.routes.playground import playground
from kael_server.routes.status import STATUS_ROUTES
from kael_server.routes.tokens import detokenize, tokenize

ROUTES = [generate, completions, chat_completions, models, model, tokenize, detokenize, *STATUS_ROUTES, playground]

__all__ = ["ROUTES"]
