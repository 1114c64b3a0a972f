"""API keys: missing, wrong and right keys on every route; the key files and variable; the
OpenAPI security scheme; and no key (right or wrong) in the server's logs, in either format."""

from __future__ import annotations

import hmac
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from kael_server.auth import ENV_VAR, MISSING, WRONG, ApiKeys, configured_keys, read_key_file
from kael_server.config import ServerConfig
from kael_server.errors import ServerConfigError
from litestar import Litestar
from litestar.testing import TestClient

from kael_server import Generator, create_app

from .conftest import samples
from .fakes import ByteTokenizer, FakeChatTemplate, FakeModel
from .processes import free_port, server_process

KEY = "kael-test-key-Z9q"
OTHER = "second-key-7Hx"
OPEN = {("/health", "GET"), ("/health", "HEAD"), ("/ready", "GET"), ("/ready", "HEAD"), ("/", "GET")}
METRICS = {("/metrics", "GET"), ("/metrics", "HEAD")}
BODIES: dict[str, Any] = {
    "/generate": {"prompt": "ab", "max_tokens": 3},
    "/v1/completions": {"prompt": "ab", "max_tokens": 3},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "ab"}], "max_tokens": 3},
    "/tokenize": {"prompt": "ab"},
    "/detokenize": {"tokens": [104, 105]},
}


def keyed_app(*, protect_metrics: bool = False, keys: tuple[str, ...] = (KEY, OTHER)) -> Litestar:
    generator = Generator(FakeModel(), ByteTokenizer(), make_rng=random.Random, chat_template=FakeChatTemplate())
    return create_app(generator, ServerConfig(api_keys=keys, protect_metrics=protect_metrics))


def every_route(app: Litestar) -> list[tuple[str, str]]:
    """(path, method) of every handler the app has, but Litestar's OPTIONS and the docs' catch-all."""
    return sorted(
        (route.path, method)
        for route in app.routes
        for handler in getattr(route, "route_handlers", ())
        for method in handler.http_methods
        if method != "OPTIONS" and "{" not in route.path
    )


def is_open(path: str, method: str, protect_metrics: bool) -> bool:
    return (
        (path, method) in OPEN
        or path == "/schema"
        or path.startswith("/schema/")
        or ((path, method) in METRICS and not protect_metrics)
    )


def call(client: TestClient[Litestar], path: str, method: str, authorization: str | None) -> httpx.Response:
    headers = {} if authorization is None else {"Authorization": authorization}
    return client.request(method, path, headers=headers, json=BODIES.get(path) if method == "POST" else None)


def assert_refused(response: httpx.Response, message: str, method: str) -> None:
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith('Bearer realm="kael-server"')
    assert ('error="invalid_token"' in response.headers["www-authenticate"]) == (message == WRONG)
    if method != "HEAD":
        assert response.json() == {
            "error": {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
        }


@pytest.mark.parametrize("protect_metrics", [False, True])
def test_missing_wrong_and_right_keys_on_every_route(protect_metrics: bool) -> None:
    app = keyed_app(protect_metrics=protect_metrics)
    routes = every_route(app)
    assert {("/generate", "POST"), ("/v1/completions", "POST"), ("/v1/chat/completions", "POST")} <= set(routes)
    assert ("/v1/models", "GET") in routes
    assert {("/tokenize", "POST"), ("/detokenize", "POST")} | OPEN | METRICS <= set(routes)
    with TestClient(app) as client:
        for path, method in routes:
            is_free = is_open(path, method, protect_metrics)
            for authorization, refusal in (
                (None, MISSING),
                ("Bearer", MISSING),
                ("Basic " + KEY, MISSING),
                ("Bearer wrong-key", WRONG),
                (f"Bearer {KEY}x", WRONG),  # a longer key
                (f"Bearer {KEY[:-1]}", WRONG),  # a prefix
                (f"Bearer {KEY.upper()}", WRONG),  # keys are case-sensitive
            ):
                response = call(client, path, method, authorization)
                if is_free:
                    assert response.status_code == 200, (path, method, authorization)
                else:
                    assert_refused(response, refusal, method)
            for authorization in (f"Bearer {KEY}", f"bearer {OTHER}", f"Bearer  {KEY} "):
                response = call(client, path, method, authorization)
                assert response.status_code == 200, (path, method, authorization, response.text)


def test_right_key_gets_the_real_answers() -> None:
    with TestClient(keyed_app()) as client:
        auth = {"Authorization": f"Bearer {KEY}"}
        plain = client.post("/generate", json={"prompt": "ab", "max_tokens": 3, "temperature": 0}, headers=auth)
        assert plain.json()["tokens"] == 3
        assert client.post("/tokenize", json={"prompt": "hé"}, headers=auth).json()["tokens"] == [104, 0xC3, 0xA9]
        assert client.get("/v1/models", headers=auth).json()["data"][0]["max_model_len"] == 128
        streamed = client.post("/generate", json={"prompt": "ab", "max_tokens": 3, "stream": True}, headers=auth)
        assert streamed.text.endswith("data: [DONE]\n\n")


def test_without_keys_every_route_is_open() -> None:
    app = create_app(Generator(FakeModel(), ByteTokenizer(), make_rng=random.Random, chat_template=FakeChatTemplate()))
    with TestClient(app) as client:
        for path, method in every_route(app):
            assert call(client, path, method, None).status_code == 200, (path, method)


def test_refused_generations_are_counted_and_logged_as_rejected() -> None:
    app = keyed_app()
    with TestClient(app) as client:
        assert client.post("/generate", json=BODIES["/generate"]).status_code == 401
        assert client.post("/v1/completions", json=BODIES["/v1/completions"]).status_code == 401
        text = client.get("/metrics").text
    assert samples(text)[("kael_requests_total", (("status", "rejected"),))] == 2
    assert samples(text)[("kael_generated_tokens_total", ())] == 0


def test_the_openai_client_with_the_key_works_and_without_it_is_refused() -> None:
    with TestClient(keyed_app()) as client:
        good = openai.OpenAI(base_url="http://testserver.local/v1", api_key=KEY, http_client=client, max_retries=0)
        completion = good.completions.create(model="kael-gpt2", prompt="ab", max_tokens=4, temperature=0)
        assert completion.usage is not None and completion.usage.completion_tokens == 4
        bad = openai.OpenAI(base_url="http://testserver.local/v1", api_key="nope", http_client=client, max_retries=0)
        with pytest.raises(openai.AuthenticationError) as refused:
            bad.completions.create(model="kael-gpt2", prompt="ab", max_tokens=4)
        assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"


@pytest.mark.parametrize("protect_metrics", [False, True])
def test_the_openapi_document_has_the_bearer_scheme(protect_metrics: bool) -> None:
    with TestClient(keyed_app(protect_metrics=protect_metrics)) as client:
        doc = client.get("/schema/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key of the server (--api-key, --api-key-file or KAEL_API_KEY).",
    }
    assert doc["security"] == [{"bearer": []}]
    paths = doc["paths"]
    for path in ("/health", "/ready"):
        assert paths[path]["get"]["security"] == [] and paths[path]["head"]["security"] == []
    for path, method in (("/generate", "post"), ("/v1/completions", "post"), ("/tokenize", "post")):
        operation = paths[path][method]
        assert "security" not in operation  # the document's: bearer
        assert operation["responses"]["401"]["content"]["application/json"]["schema"]["required"] == ["error"]
    assert ("security" in paths["/metrics"]["get"]) == (not protect_metrics)


def test_without_keys_the_document_has_no_security() -> None:
    app = create_app(Generator(FakeModel(), ByteTokenizer(), make_rng=random.Random))
    with TestClient(app) as client:
        doc = client.get("/schema/openapi.json").json()
    assert "security" not in doc and "securitySchemes" not in doc.get("components", {})
    assert "401" not in doc["paths"]["/generate"]["post"]["responses"]


def test_keys_are_compared_with_compare_digest_against_every_key(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = ApiKeys(["k1", "k2", "k3"])
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    for presented, expected in ((b"k1", True), (b"k3", True), (b"k4", False), (b"", False)):
        calls.clear()
        assert keys.accepts(presented) is expected
        assert len(calls) == 3  # every key, even after a match
        assert all(len(a) == len(b) == 32 for a, b in calls)  # digests: the length says nothing
    assert "k1" not in repr(keys) and repr(keys) == "ApiKeys(3 keys)"


def test_key_file_lines_comments_and_whitespace(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# the team's keys\n\n  alpha-1  \n#beta-2\nbeta-3\r\n\t\n", encoding="utf-8")
    assert read_key_file(path) == ["alpha-1", "beta-3"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "holds no API key"),
        (b"# only a comment\n\n   \n", "holds no API key"),
        (b"sec\xffret\n", "is not UTF-8 text"),
        (b"good\nhas space inside\n", "line 2: an API key must be printable ASCII"),
        ("ключ\n".encode(), "line 1: an API key must be printable ASCII"),
    ],
)
def test_bad_key_files_are_refused_without_showing_the_keys(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "keys"
    path.write_bytes(content)
    with pytest.raises(ServerConfigError, match=expected) as refused:
        read_key_file(path)
    assert "space inside" not in str(refused.value) and "ключ" not in str(refused.value)
    assert "ret" not in str(refused.value).replace(str(path), "")


def test_unreadable_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ServerConfigError, match="cannot be read: No such file or directory"):
        read_key_file(tmp_path / "missing")
    with pytest.raises(ServerConfigError, match="cannot be read"):
        read_key_file(tmp_path)  # a directory


def test_keys_come_from_flags_file_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("from-file\n")
    keys = configured_keys(["flag-a", "flag-b"], path, {ENV_VAR: " from-env "})
    assert len(keys) == 4
    assert all(keys.accepts(k.encode()) for k in ("flag-a", "flag-b", "from-file", "from-env"))
    assert not keys.accepts(b" from-env ")
    assert not configured_keys([], None, {ENV_VAR: "  "})  # an empty variable is no key
    assert not configured_keys([], None, {})
    with pytest.raises(ServerConfigError, match="--api-key: an API key may not be empty"):
        configured_keys([""], None, {})
    with pytest.raises(ServerConfigError, match=f"{ENV_VAR}: an API key must be printable ASCII"):
        configured_keys([], None, {ENV_VAR: "two words"})


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kael_server.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_cli_refuses_bad_key_sources_in_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    for args, env, expected in (
        (["--api-key-file", str(tmp_path / "missing")], None, "cannot be read"),
        (["--api-key-file", str(empty)], None, "holds no API key"),
        (["--api-key", "zzq qzz"], None, "--api-key: an API key must be printable ASCII"),
        ([], {ENV_VAR: "yyw\twyy"}, f"{ENV_VAR}: an API key must be printable ASCII"),
    ):
        done = run_cli(*args, env=env)
        assert done.returncode == 2, done.stderr
        (line,) = [x for x in done.stderr.splitlines() if x.startswith("kael-server:")]
        assert expected in line
        assert "Traceback" not in done.stderr and "zzq" not in done.stderr and "yyw" not in done.stderr


def test_help_names_the_key_flags_without_any_key() -> None:
    done = run_cli("--help", env={ENV_VAR: "env-secret-in-help"})
    assert done.returncode == 0
    for flag in ("--api-key", "--api-key-file", "--protect-metrics", "--request-timeout", ENV_VAR):
        assert flag in done.stdout
    assert "env-secret-in-help" not in done.stdout


# ---- the real server process: the keys never reach its logs ----------------------------

DATA = Path(__file__).resolve().parents[1] / "data"
FILES = {
    "config.json": DATA / "tiny-gpt2",
    "model.safetensors": DATA / "tiny-gpt2",
    "vocab.json": DATA / "gpt2-tokenizer",
    "merges.txt": DATA / "gpt2-tokenizer",
}
FLAG_KEY, FILE_KEY, ENV_KEY = "flag-key-Qw3rty", "file-key-As5dfg", "env-key-Zx7cvb"
WRONG_KEYS = ("wrong-key-Pl0kij", FLAG_KEY + "0", FILE_KEY[:-2])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("kael")
    missing = [str(folder / name) for name, folder in FILES.items() if not (folder / name).is_file()]
    if missing:
        pytest.skip(f"test data missing: {', '.join(missing)}")
    directory = tmp_path_factory.mktemp("keyed") / "tiny-gpt2"
    directory.mkdir()
    for name, folder in FILES.items():
        shutil.copyfile(folder / name, directory / name)
    return directory


@pytest.fixture(params=["json", "console"])
def keyed_server(request: pytest.FixtureRequest, checkpoint: Path, tmp_path: Path) -> Iterator[tuple[Any, str, str]]:
    key_file = tmp_path / "keys"
    key_file.write_text(f"# keys\n{FILE_KEY}\n")
    port = free_port()
    command = [sys.executable, "-m", "kael_server.cli", "--data", str(checkpoint), "--port", str(port)]
    command += ["--api-key", FLAG_KEY, "--api-key-file", str(key_file), "--protect-metrics"]
    command += ["--log-format", request.param, "--log-level", "debug"]
    env_before = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = ENV_KEY  # the child inherits it
    try:
        with server_process(command, port) as process:  # /ready needs no key
            yield process, f"http://127.0.0.1:{port}", request.param
    finally:
        if env_before is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = env_before


@pytest.mark.e2e
def test_keys_never_appear_in_the_logs(keyed_server: tuple[Any, str, str]) -> None:
    process, url, log_format = keyed_server
    with httpx.Client(base_url=url, timeout=60) as client:
        for key in (FLAG_KEY, FILE_KEY, ENV_KEY):
            auth = {"Authorization": f"Bearer {key}"}
            assert client.post("/generate", json={"prompt": "Hi", "max_tokens": 3}, headers=auth).status_code == 200
            with client.stream("POST", "/v1/completions", json={"prompt": "Hi", "stream": True}, headers=auth) as r:
                assert r.status_code == 200 and list(r.iter_lines())
            assert client.get("/metrics", headers=auth).status_code == 200
        for key in WRONG_KEYS:
            auth = {"Authorization": f"Bearer {key}"}
            assert client.post("/generate", json={"prompt": "Hi"}, headers=auth).status_code == 401
            assert client.post("/tokenize", json={"prompt": "Hi"}, headers=auth).status_code == 401
            assert client.get("/metrics", headers=auth).status_code == 401
        assert client.get("/metrics").status_code == 401
        assert client.head("/health").status_code == 200
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=40) == 0
    output = process.stdout.read() if process.stdout else ""
    assert output.count("request") >= 4 * 3 + 3 * len(WRONG_KEYS)  # the requests were logged
    for secret in (FLAG_KEY, FILE_KEY, ENV_KEY, *WRONG_KEYS):
        assert secret not in output
    if log_format == "json":
        lines = [json.loads(line) for line in output.splitlines() if line.strip()]
        assert all(isinstance(line, dict) for line in lines)
        assert sum(line.get("status") == 401 for line in lines) == 3 * len(WRONG_KEYS) + 1
