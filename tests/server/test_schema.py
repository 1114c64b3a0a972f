"""schemathesis against the app's OpenAPI schema: no server errors, every answer as documented,
every body the schema says is invalid refused (and nothing refused for a field the schema does not know)."""

from __future__ import annotations

from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402
from kael_server.batching import BatchScheduler  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from kael_server import Generator, create_app  # noqa: E402

from .conftest import make_app  # noqa: E402
from .fake_batch_engine import FakeBatchEngine  # noqa: E402
from .fakes import ByteTokenizer, FakeChatTemplate, FakeModel  # noqa: E402

# A body over the size cap is rightly refused with 413 before it is even parsed.
CONFIG = schemathesis.config.SchemathesisConfig.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": ["400", "413", "422"]}}}
)
# A small context makes the prompt-too-long (413) path reachable by generated prompts.
schema = schemathesis.openapi.from_asgi("/schema/openapi.json", make_app(FakeModel(max_positions=600)), config=CONFIG)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case: Any) -> None:
    case.call_and_validate(checks=CHECKS)


# The whole OpenAI completion request (prompt lists, token ids, n, logprobs, echo, penalties,
# logit bias, ...) against a batching server too: many more examples for that one operation.
batched = schemathesis.openapi.from_asgi(
    "/schema/openapi.json",
    create_app(
        Generator(
            FakeModel(max_positions=600),
            ByteTokenizer(),
            make_scheduler=lambda g: BatchScheduler(g, FakeBatchEngine(16), queue=4),
        )
    ),
    config=CONFIG,
).include(path="/v1/completions")


@batched.parametrize()
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
def test_completions_conform_to_the_schema_when_batched(case: Any) -> None:
    case.call_and_validate(checks=CHECKS)


# The chat request (messages as objects and text parts, max_completion_tokens, logprobs with
# top_logprobs, every sampling field) against a batching server whose model has a chat template.
chat = schemathesis.openapi.from_asgi(
    "/schema/openapi.json",
    create_app(
        Generator(
            FakeModel(max_positions=600),
            ByteTokenizer(),
            chat_template=FakeChatTemplate(),
            make_scheduler=lambda g: BatchScheduler(g, FakeBatchEngine(16), queue=4),
        )
    ),
    config=CONFIG,
).include(path="/v1/chat/completions")


@chat.parametrize()
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_chat_completions_conform_to_the_schema(case: Any) -> None:
    case.call_and_validate(checks=CHECKS)
