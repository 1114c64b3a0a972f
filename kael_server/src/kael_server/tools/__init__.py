"""Tool calls (issue 30): the format a chat template uses (``detect_format``), parsing a
finished output into OpenAI ``tool_calls`` (``parse_tool_calls``), streaming
``delta.tool_calls`` chunks from token-by-token text (``ToolCallStream``) and the
``tool_choice`` constraint (``tool_choice_constraint``)."""

from __future__ import annotations

from ._choice import tool_choice_constraint
from ._formats import Format, detect_format, split_output
from ._parse import ParsedTurn, new_call_id, parse_tool_calls
from ._stream import ToolCallStream

__all__ = [
    "Format",
    "ParsedTurn",
    "ToolCallStream",
    "detect_format",
    "new_call_id",
    "parse_tool_calls",
    "split_output",
    "tool_choice_constraint",
]
