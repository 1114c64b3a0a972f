"""Failures in the model or tokenizer: 500 or a stream error event, never the exception's text;
logged server-side with traceback and request id; one log line per request without prompt text."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator

import pytest
import structlog
from kael_server.logs import HANDLER_NAME, configure_logging
from litestar.testing import TestClient

from .conftest import make_app, metric, sse_payloads
from .fakes import SECRET, ByteTokenizer, FakeModel


def test_model_failure_is_a_bare_500() -> None:
    with TestClient(make_app(FakeModel(fail_at=0))) as client:
        response = client.post("/generate", json={"prompt": "a"})
        assert response.status_code == 500
        assert response.json() == {"detail": "generation failed", "errors": None}
        assert SECRET not in response.text
        openai = client.post("/v1/completions", json={"prompt": "a"})
        assert openai.status_code == 500
        assert openai.json()["error"]["message"] == "generation failed"
        assert SECRET not in openai.text
        assert metric(client, "kael_requests_total", status="error") == 2


def test_tokenizer_failure_is_a_bare_500() -> None:
    with TestClient(make_app(tokenizer=ByteTokenizer(fail=True))) as client:
        for path in ("/generate", "/tokenize"):
            response = client.post(path, json={"prompt": "a"})
            assert response.status_code == 500
            assert SECRET not in response.text


def test_failure_mid_stream_is_one_error_event_then_done() -> None:
    with TestClient(make_app(FakeModel(fail_at=3))) as client:
        response = client.post("/generate", json={"prompt": "a", "max_tokens": 10, "stream": True})
        assert response.status_code == 200
        events = sse_payloads(response.text)
        assert len(events) == 5
        assert all(set(e) == {"text"} for e in events[:3])
        assert events[3:] == [{"error": "generation failed"}, "[DONE]"]
        assert SECRET not in response.text
        openai = client.post("/v1/completions", json={"prompt": "a", "stream": True})
        assert sse_payloads(openai.text)[-2]["error"]["message"] == "generation failed"
        assert SECRET not in openai.text
        assert metric(client, "kael_requests_total", status="error") == 2


def test_failure_is_logged_with_traceback_and_request_id() -> None:
    with structlog.testing.capture_logs() as logs, TestClient(make_app(FakeModel(fail_at=1))) as client:
        response = client.post("/generate", json={"prompt": "a"}, headers={"x-request-id": "req-42"})
    assert response.headers["x-request-id"] == "req-42"
    (failure,) = [e for e in logs if e["event"] == "internal_error"]
    assert failure["request_id"] == "req-42"
    assert str(failure["exc_info"]) == SECRET
    assert failure["exc_info"].__traceback__ is not None
    (line,) = [e for e in logs if e["event"] == "request"]
    assert (line["request_id"], line["status"], line["outcome"]) == ("req-42", 500, "error")


@pytest.fixture
def server_logging() -> Iterator[None]:
    """configure_logging's global state (structlog, the root logger, warnings) undone afterwards."""
    root = logging.getLogger()
    level = root.level
    try:
        yield
    finally:
        structlog.reset_defaults()
        for handler in [h for h in root.handlers if h.name == HANDLER_NAME]:
            root.removeHandler(handler)
        root.setLevel(level)
        logging.captureWarnings(False)


def test_standard_logging_and_warnings_are_json_lines_too(
    capsys: pytest.CaptureFixture[str], server_logging: None
) -> None:
    configure_logging("json")
    logging.getLogger("uvicorn.error").info("Started server process [%d]", 42)
    logging.getLogger("uvicorn.error").debug("below the level")
    try:
        raise ValueError(SECRET)
    except ValueError:
        logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a plugin failed to load", RuntimeWarning, stacklevel=1)
    configure_logging("json")  # again: still one handler, so one line per event
    logging.getLogger("uvicorn.error").warning("Shutting down")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    started, failure, warned, shutdown = lines
    assert (started["event"], started["logger"], started["level"]) == (
        "Started server process [42]",
        "uvicorn.error",
        "info",
    )
    assert failure["event"] == "Exception in ASGI application" and failure["level"] == "error"
    assert failure["exception"][0]["exc_value"] == SECRET  # a structured traceback, no local variables
    assert "locals" not in json.dumps(failure["exception"])
    assert warned["logger"] == "py.warnings" and "a plugin failed to load" in warned["event"]
    assert shutdown["event"] == "Shutting down" and "timestamp" in shutdown


def test_one_json_line_per_request_without_prompt_or_generated_text(
    capsys: pytest.CaptureFixture[str], server_logging: None
) -> None:
    configure_logging("json")
    try:
        prompt = "my-private-prompt"
        model = FakeModel(script=b"zebra-quokka-xu")
        with TestClient(make_app(model)) as client:
            client.post("/generate", json={"prompt": prompt, "max_tokens": 15})
            client.post("/generate", json={"prompt": prompt, "max_tokens": 15, "stream": True})
            client.post("/generate", json={"prompt": prompt, "top_k": -1})
            client.get("/health")
            model.fail_at = 3  # a traceback is logged: without the frames' local variables
            client.post("/generate", json={"prompt": prompt, "max_tokens": 15})
    finally:
        structlog.reset_defaults()
    err = capsys.readouterr().err
    assert prompt not in err and "zebra" not in err and "quokka" not in err
    lines = [json.loads(line) for line in err.splitlines()]
    requests = [line for line in lines if line["event"] == "request"]
    assert [(r["route"], r["status"]) for r in requests] == [
        ("/generate", 200),
        ("/generate", 200),
        ("/generate", 422),
        ("/health", 200),
        ("/generate", 500),
    ]
    (failure,) = [line for line in lines if line["event"] == "internal_error"]
    assert failure["exception"][0]["exc_value"] == SECRET
    assert failure["request_id"] == requests[-1]["request_id"]
    assert requests[0]["prompt_tokens"] == len(prompt) and requests[0]["generated_tokens"] == 15
    assert requests[1]["outcome"] == "ok" and requests[2]["outcome"] == "rejected"
    assert all(len(r["request_id"]) == 32 for r in requests)
    assert len({r["request_id"] for r in requests}) == 5


def test_unexpected_request_ids_are_replaced() -> None:
    with TestClient(make_app()) as client:
        response = client.get("/health", headers={"x-request-id": "bad id\twith spaces"})
        assert response.headers["x-request-id"] != "bad id\twith spaces"
        assert len(response.headers["x-request-id"]) == 32


def test_unknown_route_and_wrong_method_are_plain_http_errors() -> None:
    with TestClient(make_app()) as client:
        missing = client.get("/nope")
        assert (missing.status_code, missing.json()["detail"]) == (404, "Not Found")
        wrong = client.get("/generate")
        assert wrong.status_code == 405
        assert "POST" in wrong.headers["allow"]
        assert metric(client, "kael_requests_total", status="rejected") == 0
