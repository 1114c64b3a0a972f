"""End to end: the real ``kael-server`` command serving a tiny GPT-2 checkpoint with kael.

Needs kael's GPT-2 (skipped until ``kael.GPT`` exists) and the test data: the checkpoint in
``tests/data/tiny-gpt2`` (config.json, model.safetensors) and GPT-2's tokenizer files in
``tests/data/gpt2-tokenizer`` (vocab.json, merges.txt), both copied from shared/data.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .processes import free_port, server_process

DATA = Path(__file__).resolve().parents[1] / "data"
CHECKPOINT = DATA / "tiny-gpt2"
TOKENIZER = DATA / "gpt2-tokenizer"
pytestmark = pytest.mark.e2e

FILES = {"config.json": CHECKPOINT, "model.safetensors": CHECKPOINT, "vocab.json": TOKENIZER, "merges.txt": TOKENIZER}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kael = pytest.importorskip("kael")
    if not hasattr(kael, "GPT") or not hasattr(kael, "BpeTokenizer"):
        pytest.skip("kael.GPT / kael.BpeTokenizer are not there yet")
    missing = [str(folder / name) for name, folder in FILES.items() if not (folder / name).is_file()]
    if missing:
        pytest.skip(f"test data missing: {', '.join(missing)}")
    directory = tmp_path_factory.mktemp("checkpoint") / "tiny-gpt2"
    directory.mkdir()
    for name, folder in FILES.items():
        shutil.copyfile(folder / name, directory / name)
    return directory


@pytest.fixture
def served(checkpoint: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    port = free_port()
    command = [shutil.which("kael-server") or sys.executable]
    if command[0] == sys.executable:
        command += ["-m", "kael_server.cli"]
    command += ["--data", str(checkpoint), "--device", "cpu", "--port", str(port), "--log-format", "json"]
    with server_process(command, port) as process:
        yield process, f"http://127.0.0.1:{port}"


def stream_events(client: httpx.Client, path: str, body: dict[str, object]) -> Iterator[str]:
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                yield line[len("data: ") :]


def test_generate_stream_openai_and_metrics(served: tuple[subprocess.Popen[str], str]) -> None:
    _, url = served
    with httpx.Client(base_url=url, timeout=60) as client:
        request = {"prompt": "Hello, my name is", "max_tokens": 20, "temperature": 0}
        plain = client.post("/generate", json=request).json()
        assert plain["tokens"] == 20 or 0 < plain["tokens"] < 20  # fewer only at <|endoftext|>
        events = list(stream_events(client, "/generate", {**request, "stream": True}))
        assert events[-1] == "[DONE]"
        assert "".join(json.loads(e)["text"] for e in events[:-1]) == plain["text"]
        tokens = client.post("/tokenize", json={"prompt": "Hello, my name is"}).json()
        assert tokens["max_model_len"] == 64 and tokens["count"] == len(tokens["tokens"]) == 5

        api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        (model,) = api.models.list().data
        assert client.get("/v1/models").json()["data"][0]["max_model_len"] == 64  # vLLM's field
        completion = api.completions.create(model=model.id, prompt="Hello", max_tokens=8, temperature=0)
        assert completion.usage is not None and completion.usage.prompt_tokens == 1
        chunks = list(api.completions.create(model=model.id, prompt="Hello", max_tokens=8, temperature=0, stream=True))
        assert "".join(c.choices[0].text for c in chunks) == completion.choices[0].text
        seeded = [
            api.completions.create(model=model.id, prompt="Hi", max_tokens=8, temperature=1.0, seed=3).choices[0].text
            for _ in range(2)
        ]
        assert seeded[0] == seeded[1]

        families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
        ok = [s.value for s in families["kael_requests"].samples if s.labels.get("status") == "ok"]
        assert ok == [6]
        generated = families["kael_generated_tokens"].samples[0].value
        assert generated >= 8 + 8 + 8 + 8
        assert families["kael_peak_memory_bytes"].samples[0].value > 10_000_000


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_stream_drains_and_exits_0(served: tuple[subprocess.Popen[str], str], sig: signal.Signals) -> None:
    process, url = served
    with httpx.Client(base_url=url, timeout=60) as client:
        body = {"prompt": "Once", "max_tokens": 60, "temperature": 0, "stream": True}
        events = stream_events(client, "/generate", body)
        received = [next(events)]
        process.send_signal(sig)  # SIGINT is Ctrl+C
        received.extend(events)
    assert received[-1] == "[DONE]"
    # A tiny model may finish its 60 tokens before the signal lands; otherwise the drain cut it.
    if len(received) < 61:
        assert received[-2] == '{"error":"server shutting down"}'
    assert process.wait(timeout=40) == 0  # a drained shutdown is a normal exit
    output = process.stdout.read() if process.stdout else ""
    assert "Hello" not in output and "Once" not in output  # no prompt text in the logs
    # --log-format json: every line is a JSON object, uvicorn's own lines included.
    lines = [json.loads(line) for line in output.splitlines() if line.strip()]
    assert all(isinstance(line, dict) and "event" in line and "timestamp" in line for line in lines)
    uvicorn = [line["event"] for line in lines if line.get("logger") == "uvicorn.error"]
    assert f"Started server process [{process.pid}]" in uvicorn
    assert "Application startup complete." in uvicorn and "Application shutdown complete." in uvicorn
    assert "Traceback" not in output and "KeyboardInterrupt" not in output
