"""Streaming tool-call parsing: text arrives token by token; ``ToolCallStream.feed`` returns
the OpenAI ``delta`` dicts to send: ``{"content": ...}`` for plain text (a piece that may begin a
tool-call marker is held back), and ``{"tool_calls": [...]}`` with, per call, first its
``index``, ``id``, ``type`` and ``function.name`` (arguments ``""``), then fragments of
``function.arguments`` (the raw JSON text the model writes, concatenating to the arguments)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._formats import Format, split_output
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
        if len(s.content) > self._content_sent and not s.calls:
            out.append({"content": s.content[self._content_sent :]})
            self._content_sent = len(s.content)
        for i, c in enumerate(s.calls):
            if c.name is None:
                break
            if i == len(self._args_sent):
                if i == 0 and len(s.content) > self._content_sent and s.content.strip():
                    out.append({"content": s.content[self._content_sent :]})
                    self._content_sent = len(s.content)
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
            frag = c.args_raw[self._args_sent[i] :]
            if frag:
                out.append({"tool_calls": [{"index": i, "function": {"arguments": frag}}]})
                self._args_sent[i] = len(c.args_raw)
        return out

    def finish(self) -> list[dict[str, Any]]:
        """At the end of the output: the content still held back when no call was made."""
        if self._args_sent or self._content_sent >= len(self.text):
            return []
        rest = self.text[self._content_sent :]
        self._content_sent = len(self.text)
        return [{"content": rest}]
