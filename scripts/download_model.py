"""Download a Hugging Face Hub model (config, generation config, tokenizer, safetensors) for kael.

    python scripts/download_model.py Qwen/Qwen2.5-0.5B-Instruct --out weights/qwen2.5-0.5b
    python -m kael generate --model weights/qwen2.5-0.5b "Hello"
    kael-server --data weights/qwen2.5-0.5b

Fetches ``config.json``, ``generation_config.json``, the tokenizer files that exist
(``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``, ``vocab.json``,
``merges.txt``, ``chat_template.jinja``) and the weights: ``model.safetensors``, or
``model.safetensors.index.json`` and every shard it names. Plain HTTPS with urllib (no
extra packages); ``HF_TOKEN`` is sent as a bearer token (gated and private models),
``HF_ENDPOINT`` replaces https://huggingface.co. Each file is downloaded to
``.NAME.part`` beside its target and renamed when complete; an interrupted download
resumes from its ``.part`` file with an HTTP range request. Needs network access;
kael's tests never call the network (they test the argument handling and URLs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "CONFIG_FILES",
    "DEFAULT_ENDPOINT",
    "TOKENIZER_FILES",
    "DownloadError",
    "check_model_id",
    "download",
    "file_url",
    "main",
    "request_headers",
    "shard_names",
]

DEFAULT_ENDPOINT = "https://huggingface.co"
CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_CHUNK = 1 << 20


class DownloadError(Exception):
    """A download that cannot proceed: bad arguments, HTTP errors, a malformed index."""


def check_model_id(model_id: str) -> str:
    """``owner/name`` (or a bare ``name``) as the Hub spells repository ids; anything else is refused."""
    parts = model_id.split("/")
    if not 1 <= len(parts) <= 2 or not all(_PART.fullmatch(p) and ".." not in p for p in parts):
        raise DownloadError(f"model id {model_id!r} is not a Hub repository id like 'owner/name'")
    return model_id


def file_url(model_id: str, filename: str, revision: str = "main", endpoint: str = DEFAULT_ENDPOINT) -> str:
    """The Hub's download URL of one file of a model at a revision (branch, tag or commit)."""
    check_model_id(model_id)
    if not revision or revision in (".", ".."):
        raise DownloadError(f"revision {revision!r} is not a branch, tag or commit")
    if not endpoint.startswith(("https://", "http://")):
        raise DownloadError(f"endpoint {endpoint!r} must be an http(s) URL")
    rev = urllib.parse.quote(revision, safe="")
    return f"{endpoint.rstrip('/')}/{model_id}/resolve/{rev}/{urllib.parse.quote(filename)}"


def request_headers(token: str | None, start: int = 0) -> dict[str, str]:
    """Headers of one request: the bearer token when given, a range to resume from byte ``start``."""
    headers = {"User-Agent": "kael-download-model/1"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if start:
        headers["Range"] = f"bytes={start}-"
    return headers


def shard_names(index: Any) -> list[str]:
    """The shard files a ``model.safetensors.index.json`` names, checked to be plain file names."""
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise DownloadError(f"{INDEX} has no weight_map object")
    names = sorted(set(weight_map.values()))
    for name in names:
        if not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", "..") or "\\" in name:
            raise DownloadError(f"{INDEX} names the shard {name!r}, which is not a plain file name")
    return names


Opener = Callable[[urllib.request.Request], Any]


def download(url: str, target: str, token: str | None, *, opener: Opener = urllib.request.urlopen) -> int | None:
    """Download ``url`` to ``target`` atomically, resuming a ``.part`` file; None when the file is absent (404)."""
    part = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.part")
    start = os.path.getsize(part) if os.path.exists(part) else 0
    try:
        response = opener(urllib.request.Request(url, headers=request_headers(token, start)))
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        if e.code == 416 and start:  # the part file is already complete
            os.replace(part, target)
            return os.path.getsize(target)
        hint = " (a gated or private model: set HF_TOKEN)" if e.code in (401, 403) else ""
        raise DownloadError(f"GET {url}: HTTP {e.code} {e.reason}{hint}") from None
    except urllib.error.URLError as e:
        raise DownloadError(f"GET {url}: {e.reason}") from None
    with response:
        status = getattr(response, "status", 200)
        mode = "ab" if status == 206 else "wb"  # a server that ignores the range sends it all again
        length = response.headers.get("Content-Length")
        expected = None if length is None else int(length) + (start if status == 206 else 0)
        with open(part, mode) as f:
            while chunk := response.read(_CHUNK):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
    size = os.path.getsize(part)
    if expected is not None and size != expected:
        raise DownloadError(f"GET {url}: got {size} of {expected} bytes; run again to resume")
    os.replace(part, target)
    return size


def _fetch_all(
    names: Iterable[str], args: argparse.Namespace, token: str | None, *, required: bool, opener: Opener
) -> list[str]:
    got = []
    for name in names:
        url = file_url(args.model_id, name, args.revision, args.endpoint)
        size = download(url, os.path.join(args.out, name), token, opener=opener)
        if size is None:
            if required:
                raise DownloadError(f"{args.model_id} has no {name} at revision {args.revision!r} ({url})")
            continue
        print(f"{name}: {size:,} bytes", file=sys.stderr)
        got.append(name)
    return got


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("model_id", help="Hub repository id, e.g. Qwen/Qwen2.5-0.5B-Instruct")
    parser.add_argument("--out", default=None, help="target directory (default weights/<name>)")
    parser.add_argument("--revision", default="main", help="branch, tag or commit (default main)")
    parser.add_argument(
        "--endpoint", default=os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT), help="Hub URL (default $HF_ENDPOINT)"
    )
    args = parser.parse_args(argv)
    try:
        check_model_id(args.model_id)
        file_url(args.model_id, "config.json", args.revision, args.endpoint)
    except DownloadError as e:
        parser.error(str(e))
    if args.out is None:
        args.out = os.path.join("weights", args.model_id.split("/")[-1])
    return args


def main(argv: list[str] | None = None, *, opener: Opener = urllib.request.urlopen) -> int:
    args = parse_args(argv)
    token = os.environ.get("HF_TOKEN") or None
    os.makedirs(args.out, exist_ok=True)
    try:
        _fetch_all(CONFIG_FILES[:1], args, token, required=True, opener=opener)
        _fetch_all(CONFIG_FILES[1:] + TOKENIZER_FILES, args, token, required=False, opener=opener)
        if not _fetch_all([WEIGHTS], args, token, required=False, opener=opener):
            _fetch_all([INDEX], args, token, required=True, opener=opener)
            with open(os.path.join(args.out, INDEX), encoding="utf-8") as f:
                try:
                    index = json.load(f)
                except json.JSONDecodeError as e:
                    raise DownloadError(f"{INDEX} is not JSON ({e})") from None
            _fetch_all(shard_names(index), args, token, required=True, opener=opener)
    except DownloadError as e:
        print(f"download_model: {e}", file=sys.stderr)
        return 1
    print(f"{args.model_id} -> {args.out}  (kael-server --data {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
