"""scripts/download_model.py offline: argument handling, URL building, headers, and the whole
download flow (single file, sharded index, resume, 404/401) against an in-memory fake Hub
(no network is ever used).
"""

from __future__ import annotations

import email.message
import importlib.util
import io
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


dm = _load("download_model")


class _Response(io.BytesIO):
    def __init__(self, data: bytes, status: int) -> None:
        super().__init__(data)
        self.status = status
        self.headers = email.message.Message()
        self.headers["Content-Length"] = str(len(data))


class FakeHub:
    """Serves ``files`` under one model's resolve URLs; honours Range; records the requests."""

    def __init__(self, files: dict[str, bytes], *, status: int = 404, prefix: str = "") -> None:
        self.files, self.status, self.prefix = files, status, prefix
        self.requests: list[urllib.request.Request] = []

    def __call__(self, req: urllib.request.Request) -> _Response:
        self.requests.append(req)
        name = req.full_url.rsplit("/", 1)[1]
        if not req.full_url.startswith(self.prefix) or name not in self.files:
            raise urllib.error.HTTPError(req.full_url, self.status, "Not Found", email.message.Message(), None)
        data = self.files[name]
        rng = req.get_header("Range")
        if rng:
            start = int(rng.removeprefix("bytes=").rstrip("-"))
            if start >= len(data):
                raise urllib.error.HTTPError(req.full_url, 416, "Range", email.message.Message(), None)
            return _Response(data[start:], 206)
        return _Response(data, 200)


def test_file_url_quotes_revision_and_name() -> None:
    assert dm.file_url("Qwen/Qwen2.5-0.5B", "config.json") == (
        "https://huggingface.co/Qwen/Qwen2.5-0.5B/resolve/main/config.json"
    )
    assert dm.file_url("gpt2", "a b.json", "refs/pr/1", "https://hub.example/") == (
        "https://hub.example/gpt2/resolve/refs%2Fpr%2F1/a%20b.json"
    )


@pytest.mark.parametrize("bad", ["", "a/b/c", "../x", "a/..", "/abs", "a b/c", "owner/", "-x/y"])
def test_bad_model_ids_are_refused(bad: str) -> None:
    with pytest.raises(dm.DownloadError, match="not a Hub repository id"):
        dm.check_model_id(bad)


def test_bad_arguments_exit_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        dm.parse_args(["../evil"])
    assert info.value.code == 2 and "not a Hub repository id" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        dm.parse_args(["a/b", "--endpoint", "ftp://x"])
    with pytest.raises(SystemExit):
        dm.parse_args([])


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.example")
    args = dm.parse_args(["org/Model-1"])
    assert (args.out, args.revision, args.endpoint) == ("weights/Model-1", "main", "https://mirror.example")


def test_headers() -> None:
    assert "Authorization" not in dm.request_headers(None)
    h = dm.request_headers("tok", 10)
    assert h["Authorization"] == "Bearer tok" and h["Range"] == "bytes=10-"


def test_single_file_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "secret")
    files = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b"{}", "model.safetensors": b"W" * 3000}
    hub = FakeHub(files, prefix="https://huggingface.co/o/m/resolve/v1/")
    assert dm.main(["o/m", "--out", str(tmp_path), "--revision", "v1"], opener=hub) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)
    for name, data in files.items():
        assert (tmp_path / name).read_bytes() == data
    assert all(r.get_header("Authorization") == "Bearer secret" for r in hub.requests)
    asked = [r.full_url.rsplit("/", 1)[1] for r in hub.requests]
    assert "model.safetensors.index.json" not in asked and "generation_config.json" in asked


def test_sharded_model(tmp_path: Path) -> None:
    index = {"metadata": {"total_size": 8}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}
    files = {
        "config.json": b"{}",
        "model.safetensors.index.json": json.dumps(index).encode(),
        "s1.safetensors": b"1234",
        "s2.safetensors": b"5678",
    }
    assert dm.main(["o/m", "--out", str(tmp_path)], opener=FakeHub(files)) == 0
    assert (tmp_path / "s2.safetensors").read_bytes() == b"5678"


def test_index_with_unsafe_shard_name_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index = {"weight_map": {"a": "../../etc/x"}}
    files = {"config.json": b"{}", "model.safetensors.index.json": json.dumps(index).encode()}
    assert dm.main(["o/m", "--out", str(tmp_path / "out")], opener=FakeHub(files)) == 1
    assert "not a plain file name" in capsys.readouterr().err


def test_resume_from_part_file(tmp_path: Path) -> None:
    data = bytes(range(256)) * 10
    (tmp_path / ".model.safetensors.part").write_bytes(data[:1000])
    hub = FakeHub({"model.safetensors": data})
    assert dm.download(
        "https://h/o/m/resolve/main/model.safetensors", str(tmp_path / "model.safetensors"), None, opener=hub
    ) == len(data)
    assert (tmp_path / "model.safetensors").read_bytes() == data
    assert hub.requests[0].get_header("Range") == "bytes=1000-"
    assert not (tmp_path / ".model.safetensors.part").exists()


def test_complete_part_file_is_kept(tmp_path: Path) -> None:
    (tmp_path / ".x.part").write_bytes(b"abc")
    got = dm.download("https://h/o/m/resolve/main/x", str(tmp_path / "x"), None, opener=FakeHub({"x": b"abc"}))
    assert got == 3 and (tmp_path / "x").read_bytes() == b"abc"


def test_missing_config_and_auth_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dm.main(["o/m", "--out", str(tmp_path)], opener=FakeHub({})) == 1
    assert "has no config.json" in capsys.readouterr().err
    assert dm.main(["o/m", "--out", str(tmp_path)], opener=FakeHub({}, status=401)) == 1
    assert "set HF_TOKEN" in capsys.readouterr().err


def test_no_weights_at_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dm.main(["o/m", "--out", str(tmp_path)], opener=FakeHub({"config.json": b"{}"})) == 1
    assert "model.safetensors.index.json" in capsys.readouterr().err


def test_download_gpt2_is_an_alias(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(dm, "main", lambda argv: calls.append(argv) or 0)
    gpt2 = _load("download_gpt2")
    monkeypatch.setattr(gpt2, "download_model", dm)
    assert gpt2.main(["--model", "gpt2-medium", "--out", str(tmp_path)]) == 0
    assert calls == [["openai-community/gpt2-medium", "--out", str(tmp_path)]]
