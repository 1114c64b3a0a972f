"""OpenAPI documentation for routes that read their own body (to cap and validate it themselves).

Litestar documents a request body only for a ``data`` parameter, which would make it parse the
body before the route could refuse it; ``documented`` instead attaches the msgspec JSON
Schema of the body and of every response to the route's Operation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import msgspec
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIResponse, Operation, RequestBody, Schema

__all__ = ["JSON", "documented", "schema_of", "sse_events"]

JSON = "application/json"
_REASONS = {
    200: "OK",
    400: "Invalid request",
    413: "Request body or prompt too large",
    422: "Invalid request",
    429: "Busy: a generation is running; retry after the Retry-After seconds",
    499: "Client disconnected (logged only: nobody receives it)",
    500: "Generation failed (details in the server log)",
    503: "Model loading or server shutting down",
}


_REPLACE = "x-kael-schema"
"""A field's ``extra_json_schema`` key whose value replaces msgspec's schema of the field's type
(for a union msgspec cannot state exactly, such as OpenAI's four shapes of ``prompt``)."""
_KEPT = ("description", "default", "title")


def schema_of(tp: Any) -> dict[str, Any]:
    """msgspec's JSON Schema of ``tp`` with every ``$defs`` reference inlined (OpenAPI 3.1 is JSON
    Schema) and every ``x-kael-schema`` put in place."""
    root = msgspec.json.schema(tp)
    defs = root.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(defs[node["$ref"].rsplit("/", 1)[1]])
            if _REPLACE in node:
                return {**{k: node[k] for k in _KEPT if k in node}, **inline(node[_REPLACE])}
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return cast(dict[str, Any], inline(root))


def sse_events(*payloads: Any) -> dict[str, Any]:
    """Schema of each server-sent event: ``data`` is one of ``payloads`` as JSON, or ``[DONE]``."""
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {
                "anyOf": [
                    {"const": "[DONE]"},
                    {
                        "type": "string",
                        "contentMediaType": JSON,
                        "contentSchema": {"anyOf": [schema_of(p) for p in payloads]},
                    },
                ]
            }
        },
    }


def _media(schema: Any) -> OpenAPIMediaType:
    # Litestar serialises a plain dict in the spec verbatim, so the JSON Schema can go in as is.
    return OpenAPIMediaType(schema=cast(Schema, schema))


def documented(responses: dict[int, dict[str, Any]], body: type[msgspec.Struct] | None = None) -> type[Operation]:
    """An Operation class for a route: ``responses`` maps status -> {media type: type or schema dict}."""
    request_body = RequestBody(required=True, content={JSON: _media(schema_of(body))}) if body else None
    documented_responses = {
        str(status): OpenAPIResponse(
            description=_REASONS.get(status, "Response"),
            content={media: _media(tp if isinstance(tp, dict) else schema_of(tp)) for media, tp in content.items()},
        )
        for status, content in responses.items()
    }

    @dataclass
    class DocumentedOperation(Operation):
        def __post_init__(self) -> None:
            self.request_body = request_body
            self.responses = dict(documented_responses)

    return DocumentedOperation
