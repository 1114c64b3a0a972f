"""Tool calls (issue 30): the format a chat template uses (``detect_format``), parsing a
finished output into OpenAI ``tool_calls`` (``parse_tool_calls``), streaming
``delta.tool_calls`` chunks from token-by-token text (``ToolCallStream``) and the
``tool_choice`` constraints (``tool_choice_constraint``; ``auto_grammar`` for "auto") and rendering ``tools`` through a chat
template (``render_with_tools``)."""

from __future__ import annotations

from ._auto import auto_grammar
from ._choice import tool_choice_constraint
from ._formats import Format, detect_format, split_output
from ._parse import ParsedTurn, new_call_id, parse_tool_calls
from ._render import render_with_tools, template_messages
from ._stream import ToolCallStream

__all__ = [
    "Format",
    "ParsedTurn",
    "ToolCallStream",
    "auto_grammar",
    "detect_format",
    "new_call_id",
    "parse_tool_calls",
    "render_with_tools",
    "split_output",
    "template_messages",
    "tool_choice_constraint",
]
