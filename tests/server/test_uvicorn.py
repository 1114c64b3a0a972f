"""The server as a process: uvicorn, real sockets, SIGTERM drain, disconnects (with a slow fake model)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import poll_until, samples
from .processes import free_port, server_process

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]


@pytest.fixture
def served() -> Iterator[tuple[subprocess.Popen[str], str]]:
    port = free_port()
    script = Path(__file__).with_name("fake_server.py")
    with server_process([sys.executable, str(script), str(port)], port) as process:
        yield process, f"http://127.0.0.1:{port}"


def data_lines(response: httpx.Response) -> Iterator[str]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: ") :]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_stream_ends_it_with_an_error_event_and_exits_0(
    served: tuple[subprocess.Popen[str], str], sig: signal.Signals
) -> None:
    process, url = served
    received: list[str] = []
    with httpx.stream(
        "POST", f"{url}/generate", json={"prompt": "a", "max_tokens": 500, "stream": True}, timeout=30
    ) as response:
        lines = data_lines(response)
        received.append(next(lines))
        process.send_signal(sig)  # Ctrl+C is SIGINT
        received.extend(lines)
    assert received[-2:] == ['{"error":"server shutting down"}', "[DONE]"]
    assert 1 <= len(received) - 2 < 500  # stopped long before 500 tokens (20 ms each)
    # After the drain the process ends normally, without re-raising the signal (a SIGINT
    # re-raised is a KeyboardInterrupt traceback).
    assert process.wait(timeout=30) == 0
    output = process.stdout.read() if process.stdout else ""
    assert "Traceback" not in output and "KeyboardInterrupt" not in output
    assert all(json.loads(line) for line in output.splitlines() if line.strip())  # JSON log lines only


def test_head_on_the_probes_and_metrics_over_a_real_socket(served: tuple[subprocess.Popen[str], str]) -> None:
    _, url = served
    with httpx.Client(base_url=url, timeout=10) as client:
        for path in ("/health", "/ready", "/metrics"):
            got, headed = client.get(path), client.head(path)
            assert headed.status_code == got.status_code == 200
            assert headed.content == b""
            assert headed.headers["content-type"] == got.headers["content-type"]
            if path != "/metrics":  # the metrics change between the two requests
                assert headed.headers["content-length"] == str(len(got.content))
        assert client.head("/generate").status_code == 405  # a POST route stays POST


def test_plain_client_that_disconnects_is_cancelled(served: tuple[subprocess.Popen[str], str]) -> None:
    _, url = served
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps({"prompt": "a", "max_tokens": 500}).encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert poll_until(lambda: _sample(url, "kael_requests_in_flight") == 1)
    # The socket is closed: the server notices, answers 499 (to nobody) and stops generating.
    assert poll_until(lambda: _sample(url, "kael_requests_total", status="cancelled") == 1)
    # The worker counts its tokens when it stops: far fewer than the 500 asked, at 20 ms each, and
    # possibly none: kael_requests_in_flight counts from the request's arrival, so the close can
    # come before the worker's first step, and 0 tokens is then the right count. The next request
    # gets the slot once the cancelled one has stopped and been counted (a 429 before that), and
    # adds exactly its 2 tokens.
    follow_up = {"prompt": "b", "max_tokens": 2}
    assert poll_until(lambda: httpx.post(f"{url}/generate", json=follow_up).status_code == 200)
    assert 2 <= _sample(url, "kael_generated_tokens_total") < 100 + 2


def test_health_stays_fast_while_generating(served: tuple[subprocess.Popen[str], str]) -> None:
    _, url = served
    with (
        httpx.Client(base_url=url, timeout=5) as client,
        client.stream("POST", "/generate", json={"prompt": "a", "max_tokens": 500, "stream": True}) as response,
    ):
        lines = data_lines(response)  # kept: a dropped iterator would close the stream
        next(lines)
        for _ in range(20):
            assert client.get("/health").json() == {"status": "ok"}
        busy = client.post("/generate", json={"prompt": "b"})
        assert (busy.status_code, busy.headers["retry-after"]) == (429, "1")


def _sample(url: str, name: str, **labels: str) -> float:
    return samples(httpx.get(f"{url}/metrics").text)[(name, tuple(sorted(labels.items())))]
