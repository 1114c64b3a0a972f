"""``tool_choice`` as a constraint: ``"required"`` (one or more calls of any of the tools) and a
named function (exactly one call of it) as a JSON-schema constraint on the output, written in
the generic ``json`` format (``parse_tool_calls(text, "json")`` reads it back)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kael.constraints import Constraint

__all__ = ["tool_choice_constraint"]


def _call_schema(i: int, tool: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    from kael.constraints import ConstraintError

    fn = tool.get("function") if tool.get("type") == "function" else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ConstraintError(
            f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}"
        )
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, Mapping):
        raise ConstraintError(f"tools[{i}].function.parameters: a JSON schema must be an object")
    schema = {
        "type": "object",
        "properties": {"name": {"const": fn["name"]}, "arguments": dict(params)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    return fn["name"], schema


def tool_choice_constraint(
    tools: Sequence[Mapping[str, Any]],
    tool_choice: str | Mapping[str, Any],
    *,
    parallel: bool = True,
    limits: Any = None,
) -> Constraint | None:
    """The constraint for ``tool_choice``: None for ``"auto"`` / ``"none"``; for ``"required"``
    a JSON list (one or more; exactly one unless ``parallel``) of calls of the tools; for
    ``{"type": "function", "function": {"name": n}}`` one call of ``n``. Errors name the
    request field. ``limits``: a ``kael.constraints.Limits`` (default: the library's). Needs
    kael-core's ``constraints`` extra (imported here, so the parsers work without it)."""
    from kael.constraints import ConstraintError, json_schema

    extra = {} if limits is None else {"limits": limits}
    if tool_choice in ("auto", "none"):
        return None
    if not tools:
        raise ConstraintError("tool_choice: needs a non-empty tools list")
    calls = dict(_call_schema(i, t) for i, t in enumerate(tools))
    if tool_choice == "required":
        items = {"anyOf": list(calls.values())} if len(calls) > 1 else next(iter(calls.values()))
        array = {"type": "array", "items": items, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        return json_schema(array, field="tools", **extra)
    fn = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise ConstraintError(
            f"tool_choice: expected 'auto', 'none', 'required' or a named function, got {tool_choice!r}"
        )
    if name not in calls:
        raise ConstraintError(f"tool_choice.function.name: {name!r} is not one of the tools {sorted(calls)}")
    return json_schema(calls[name], field=f"tools[{list(calls).index(name)}].function.parameters", **extra)
