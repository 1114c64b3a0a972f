"""Request-body types of the structured-output fields (``response_format``, vLLM's
``structured_outputs`` and ``guided_*``, llama.cpp's ``json_schema`` and ``grammar``): loose JSON
shapes, each with the phrase a 400 uses; ``kael_server.structured`` reads them into one
constraint, with errors naming the field inside them."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta

__all__ = ["ChoiceList", "Grammar", "GuidedJson", "JsonObject", "Pattern", "ResponseFormat", "StructuredOutputs"]

JsonObject = Annotated[dict[str, Any], Meta(extra={"expect": "a JSON object"})]
ResponseFormat = Annotated[
    dict[str, Any],
    Meta(
        description='{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": '
        '{"name": ..., "schema": {...}, "strict": true}}: the output is JSON matching the schema (always '
        "enforced, strict or not).",
        extra={"expect": 'an object {"type": "text" | "json_object" | "json_schema", ...}'},
    ),
]
StructuredOutputs = Annotated[
    dict[str, Any],
    Meta(
        description="vLLM's: one of json (a JSON schema), regex, choice (a list of strings), grammar (Lark or "
        "GBNF) or json_object: true.",
        extra={"expect": "an object with one of json, regex, choice, grammar, json_object"},
    ),
]
GuidedJson = Annotated[
    dict[str, Any] | str,
    Meta(description="vLLM's older name: a JSON schema.", extra={"expect": "a JSON schema (an object or its text)"}),
]
Pattern = Annotated[str, Meta(description="The whole output matches this regex.", extra={"expect": "a string"})]
ChoiceList = Annotated[
    list[str], Meta(description="The output is one of these strings.", extra={"expect": "a list of strings"})
]
Grammar = Annotated[
    str,
    Meta(
        description="A grammar the output matches: GBNF (llama.cpp's, root ::= ...) or Lark (llguidance's).",
        extra={"expect": "a grammar string (GBNF or Lark)"},
    ),
]
