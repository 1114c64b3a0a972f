"""load_app: the server for a GPT-2 checkpoint directory, loaded with kael."""

from __future__ import annotations

import importlib.resources
from collections.abc import Callable
from pathlib import Path

from litestar import Litestar

from kael_server.app import create_app
from kael_server.generator import Generator
from kael_server.metrics import Metrics

CHECKPOINT_FILES = ("config.json", "model.safetensors", "vocab.json", "merges.txt")
BUNDLED_MODEL = "kael-tiny"


class ServerConfigError(Exception):
    """The server cannot start as configured; the message says what to change."""


def bundled_model_dir() -> Path:
    """The model shipped inside the kael_server package, for ``kael-server`` without ``--data``."""
    path = Path(str(importlib.resources.files("kael_server"))) / "models" / BUNDLED_MODEL
    if not (path / "config.json").is_file():
        raise ServerConfigError(
            "this installation has no bundled model; pass --data DIR, a GPT-2 checkpoint "
            f"directory with {', '.join(CHECKPOINT_FILES)}"
        )
    return path


def checkpoint_dir(data: str | Path | None) -> Path:
    """``data`` checked to hold a complete checkpoint (the bundled model when None)."""
    if data is None:
        return bundled_model_dir()
    path = Path(data)
    if not path.is_dir():
        raise ServerConfigError(f"--data {str(path)!r} is not a directory")
    missing = [name for name in CHECKPOINT_FILES if not (path / name).is_file()]
    if missing:
        raise ServerConfigError(f"--data {str(path)!r} lacks {', '.join(missing)}")
    return path


def load_app(
    data: str | Path | None,
    device: str = "cpu",
    *,
    on_load_error: Callable[[BaseException], None] | None = None,
) -> Litestar:
    """The app serving the GPT-2 checkpoint in ``data`` (any size: shapes come from config.json).

    The directory is checked at once; the weights load on a thread after start-up, while
    ``/health`` answers and ``/ready`` says 503. Raises ServerConfigError or ImportError
    (kael missing) before anything is served.
    """
    path = checkpoint_dir(data)
    import kael  # imported here so kael_server stays importable (and testable) without kael

    def make_rng(seed: int) -> object:
        rng = kael.Generator()
        rng.manual_seed(seed)
        return rng

    def load(metrics: Metrics) -> Generator:
        model = kael.GPT.from_pretrained(path, device=device)
        tokenizer = kael.BpeTokenizer.from_directory(path)
        return Generator(
            model,
            tokenizer,
            device=device,
            model_name=path.name,
            make_rng=make_rng,
            metrics=metrics,
        )

    return create_app(load, on_load_error=on_load_error)
