"""Streaming tool-call parsing: text arrives token by token; ``ToolCallStream.feed`` returns
the OpenAI ``delta`` dicts to send: ``{"content": ...}`` for plain text (a piece that may begin a
tool-call marker is held back), and ``{"tool_calls": [...]}`` with, per call, first its
``index``, ``id``, ``type`` and ``function.name`` (arguments ``""``), then fragments of
``function.arguments`` (the raw JSON text the model writes, concatenating to the arguments).
Text the model writes between or after calls follows as ``content`` once it is more than
whitespace."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ._formats import Format, PartialCall, split_output
from ._parse import new_call_id

__all__ = ["ToolCallStream"]


class ToolCallStream:
    """The incremental parser of one choice's output in format ``fmt``."""

    def __init__(self, fmt: Format, id_factory: Callable[[Format], str] = new_call_id) -> None:
        self.fmt = fmt
        self.text = ""
        self._ids = id_factory
        self._content_sent = 0
        self._args_sent: list[int] = []

    @property
    def n_calls(self) -> int:
        """How many calls have been announced so far."""
        return len(self._args_sent)

    def feed(self, delta: str) -> list[dict[str, Any]]:
        """Take the next decoded text; the deltas it completes."""
        self.text += delta
        s = split_output(self.text, self.fmt)
        out: list[dict[str, Any]] = []
        for i, c in enumerate(s.calls):
            if c.name is None:
                break
            if i == len(self._args_sent):
                out += self._content(s.content, bool(s.calls))
                out.append(
                    {
                        "tool_calls": [
                            {
                                "index": i,
                                "id": self._ids(self.fmt),
                                "type": "function",
                                "function": {"name": c.name, "arguments": ""},
                            }
                        ]
                    }
                )
                self._args_sent.append(0)
            frag = self._fragment(c, i)
            if frag:
                out.append({"tool_calls": [{"index": i, "function": {"arguments": frag}}]})
        return out + self._content(s.content, bool(s.calls))

    def _content(self, content: str, calls: bool) -> list[dict[str, Any]]:
        """The content not sent yet: all of it while no call has begun, else once it holds
        more than whitespace."""
        pending = content[self._content_sent :]
        if not pending or (calls and not pending.strip()):
            return []
        self._content_sent = len(content)
        return [{"content": pending}]

    def _fragment(self, c: PartialCall, i: int) -> str:
        """The next piece of call ``i``'s arguments: the raw JSON as written, or, for arguments
        written as a JSON string, the object it holds once the string is complete."""
        if c.args_raw.startswith('"'):
            if not c.args_complete or self._args_sent[i]:
                return ""
            value = json.loads(c.args_raw)
            self._args_sent[i] = 1
            return value if isinstance(value, str) else ""
        frag = c.args_raw[self._args_sent[i] :]
        self._args_sent[i] = len(c.args_raw)
        return frag

    def finish(self) -> list[dict[str, Any]]:
        """At the end of the output: the content still held back (all of the rest when no
        call was made)."""
        if not self._args_sent:
            rest = self.text[self._content_sent :]
            self._content_sent = len(self.text)
            return [{"content": rest}] if rest else []
        return self._content(split_output(self.text, self.fmt, final=True).content, True)
