"""load_app: the server for a checkpoint directory of any kael model family, loaded with kael."""

from __future__ import annotations

import dataclasses
import importlib.resources
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litestar import Litestar

from kael_server import limits
from kael_server.app import create_app
from kael_server.batching import BatchScheduler
from kael_server.config import WEIGHTS, ServerConfig
from kael_server.errors import ServerConfigError
from kael_server.generator import Generator
from kael_server.metrics import Metrics
from kael_server.speculation import build_speculator, check_speculation

__all__ = [
    "BUNDLED_MODEL",
    "BUNDLED_MODELS",
    "CHECKPOINT_FILES",
    "CheckpointLoader",
    "TOKENIZER_FILES",
    "WEIGHTS",
    "ServerConfig",
    "ServerConfigError",
    "bundled_model_dir",
    "check_device",
    "checkpoint_dir",
    "load_app",
]

CHECKPOINT_FILES = ("config.json", "model.safetensors")
"""Files every checkpoint directory has, besides its tokenizer (TOKENIZER_FILES); sharded
weights have ``model.safetensors.index.json`` instead of ``model.safetensors``."""
_SHARDED = "model.safetensors.index.json"
TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"))
"""A Hugging Face ``tokenizer.json``, or GPT-2's vocabulary and merges: what
``kael.tokenizer.load_tokenizer`` reads, in that order."""
BUNDLED_MODEL = "kael-tiny"
BUNDLED_MODELS = ("kael-tiny", "kael-tiny-chat")
"""The models shipped inside the package: ``--data NAME`` serves one by name (when no directory
of that name exists), ``kael-tiny`` without ``--data``; ``kael-tiny-chat`` has a chat template."""
_TOKENIZER_WORDS = "tokenizer.json, or vocab.json and merges.txt"


def bundled_model_dir(name: str = BUNDLED_MODEL) -> Path:
    """A model shipped inside the kael_server package (``kael-tiny`` serves ``kael-server`` without ``--data``)."""
    if name not in BUNDLED_MODELS:
        raise ServerConfigError(f"no bundled model is called {name!r}; the bundled models are {list(BUNDLED_MODELS)}")
    path = Path(str(importlib.resources.files("kael_server"))) / "models" / name
    if not (path / "config.json").is_file():
        raise ServerConfigError(
            f"this installation has no bundled model {name!r}; pass --data DIR, a checkpoint "
            f"directory with {', '.join(CHECKPOINT_FILES)} and {_TOKENIZER_WORDS}"
        )
    return path


def checkpoint_dir(data: str | Path | None) -> Path:
    """``data`` checked to hold a complete checkpoint (the bundled model when None), or a ``.gguf`` file."""
    if data is None:
        return bundled_model_dir()
    path = Path(data)
    if path.suffix.lower() == ".gguf" and not path.is_dir():  # a llama.cpp GGUF file: model and tokenizer in one
        if not path.is_file():
            raise ServerConfigError(f"--data {str(path)!r}: no such GGUF file")
        return path
    if not path.is_dir() and str(data) in BUNDLED_MODELS:
        return bundled_model_dir(str(data))
    if not path.is_dir():
        raise ServerConfigError(f"--data {str(path)!r} is not a directory")
    missing = [name for name in CHECKPOINT_FILES if not (path / name).is_file()]
    if "model.safetensors" in missing and (path / _SHARDED).is_file():
        missing.remove("model.safetensors")
    if not any(all((path / name).is_file() for name in files) for files in TOKENIZER_FILES):
        gpt2 = TOKENIZER_FILES[1]
        if any((path / name).is_file() for name in gpt2):  # half of GPT-2's pair: name the other half
            missing += [name for name in gpt2 if not (path / name).is_file()]
        else:
            missing.append(f"a tokenizer ({_TOKENIZER_WORDS})")
    if missing:
        raise ServerConfigError(f"--data {str(path)!r} lacks {', '.join(missing)}")
    return path


def check_device(device: str) -> None:
    """ServerConfigError unless kael can allocate on ``device`` (a known device type, served by
    an installed and usable backend, an index it has); loads that backend."""
    import kael

    try:
        kael.empty(1, device=device)
    except kael.KaelError as exc:
        raise ServerConfigError(f"--device {device!r} cannot be used: {exc}") from None


def load_app(
    config: ServerConfig | str | os.PathLike[str] | None = None,
    device: str | None = None,
    *,
    on_load_error: Callable[[BaseException], None] | None = None,
    **settings: Any,
) -> Litestar:
    """The app serving ``config`` (a ServerConfig: what ``kael-server`` runs), or the checkpoint
    ``config`` names with ``device`` and ``settings`` (ServerConfig's fields as keywords, such as
    ``slots=4, kv_cache_tokens=512``; a bad one raises ServerConfigError naming its flag).

    The checkpoint is any family ``kael.models.from_pretrained`` knows by config.json's
    ``model_type`` (any size: shapes come from config.json), or a GGUF file.

    The directory and the device are checked at once; the weights load on a thread after
    start-up, while ``/health`` answers and ``/ready`` says 503. The tokenizer is
    ``kael.tokenizer.load_tokenizer``'s (with the directory's chat template, which
    ``/v1/chat/completions`` needs); texts end at its end-of-text token and at every eos id of
    the model's ``generation_config``, chat replies also at the template's end-of-turn
    tokens (Generator). Raises ServerConfigError or
    ImportError (kael missing) before anything is served. ``api_keys``, ``protect_metrics``
    and ``request_timeout`` reach create_app with the rest of the config.

    ``slots`` generations run at once, sharing each decode step through a BatchScheduler over
    kael's ``BatchDecoder`` (one slot is a batch of one); up to ``queue`` more wait for a row.

    The batch scheduler keeps keys and values in kael's paged KV cache: ``kv_cache_tokens``
    positions in all (default: ``slots`` full contexts; at least one), in blocks of 16 shared by
    prefix unless ``prefix_cache`` is False (``--kv-cache-tokens``, ``--no-prefix-cache``).

    ``speculative`` ("ngram", "draft" with ``draft_model``, or None) verifies up to
    ``spec_tokens`` drafted tokens per step (``kael_server.speculation``; the same outputs as
    without it); the draft model's vocabulary is checked against the model's now.

    ``weights`` (None: as stored; or one of WEIGHTS) loads the weights in that format
    (``kael.models.from_pretrained(weights=...)``, ``load_gguf(weights=...)``); ``/v1/models``
    reports the format the model holds.
    """
    config = _config_of(config, device, settings)
    path = checkpoint_dir(config.data)
    check_device(config.device)  # imports kael: ImportError now if it is missing
    draft = check_speculation(config, path)

    return create_app(CheckpointLoader(path, config, draft), config, on_load_error=on_load_error)


def _config_of(
    config: ServerConfig | str | os.PathLike[str] | None, device: str | None, settings: dict[str, Any]
) -> ServerConfig:
    """load_app's arguments as one ServerConfig (ServerConfigError names an unknown or bad setting)."""
    if isinstance(config, ServerConfig):
        if device is not None or settings:
            given = ["device"] * (device is not None) + sorted(settings)
            raise ServerConfigError(f"load_app: pass {given} in the ServerConfig, not beside it")
        return config
    names = {f.name for f in dataclasses.fields(ServerConfig)} - {"device"}
    unknown = sorted(set(settings) - names)
    if unknown:
        raise ServerConfigError(f"load_app: no setting named {unknown}; the settings are {sorted(names)}")
    if "data" in settings and config is not None:
        raise ServerConfigError("load_app: the checkpoint given twice (as its first argument and as data=)")
    data = os.fspath(config) if isinstance(config, os.PathLike) else config
    return ServerConfig(**{"data": data, **settings, "device": "cpu" if device is None else device})


@dataclass(frozen=True)
class CheckpointLoader:
    """The loader ``load_app`` gives create_app: run on a thread at start-up, it loads the model and
    tokenizer of ``path`` (a checkpoint directory or a GGUF file) as ``config`` says and builds the
    Generator with its BatchScheduler."""

    path: Path
    config: ServerConfig
    draft: Path | None = None
    """The ``--draft-model`` checkpoint (``--speculative draft``)."""

    def __call__(self, metrics: Metrics) -> Generator:
        """The Generator, its model loaded (ServerConfigError for a model the config cannot serve)."""
        import kael  # imported here so the web stack imports without loading kael's models

        path, config = self.path, self.config
        if path.is_file():  # GGUF: the family general.architecture names, the tokenizer from its metadata
            model, tokenizer = kael.models.load_gguf(path, device=config.device, weights=config.weights)
            if tokenizer is None:
                raise ServerConfigError(f"--data {str(path)!r}: this GGUF file has no tokenizer")
        else:
            # the family config.json's model_type names, its weights in the requested format
            model = kael.models.from_pretrained(path, device=config.device, weights=config.weights)
            tokenizer = kael.tokenizer.load_tokenizer(path)  # tokenizer.json, else vocab.json + merges.txt
        kv_cache_tokens = config.kv_cache_tokens
        if kv_cache_tokens is not None and kv_cache_tokens < model.max_positions:
            raise ServerConfigError(
                f"--kv-cache-tokens {kv_cache_tokens} cannot hold one sequence of the model's context "
                f"({model.max_positions} positions); give at least that many"
            )
        return Generator(
            model,
            tokenizer,
            device=config.device,
            # seeds become kael.Generators (the Generator's default make_rng)
            model_name=config.served_model_name[0] if config.served_model_name else path.name,
            aliases=config.served_model_name[1:],
            metrics=metrics,
            make_scheduler=_SchedulerFactory(model, config, self.draft),
        )


@dataclass(frozen=True)
class _SchedulerFactory:
    """Builds a Generator's BatchScheduler: continuous batching of up to ``config.slots`` sequences
    over kael's paged KV cache (BatchDecoder)."""

    model: Any
    config: ServerConfig
    draft: Path | None = None

    def __call__(self, generator: Generator) -> BatchScheduler:
        from kael.models import BatchDecoder

        config = self.config
        # rows for the widest request (n choices of every prompt), which runs alone when wider than the slots
        rows = max(config.slots, limits.MAX_PROMPTS * limits.MAX_CHOICES)
        tokens = config.kv_cache_tokens or config.slots * int(self.model.max_positions)  # memory follows the slots
        engine = BatchDecoder(self.model, rows, kv_cache_tokens=tokens, prefix_caching=config.prefix_cache)
        speculator = build_speculator(config, self.model, self.draft, rows)
        return BatchScheduler(
            generator,
            engine,
            queue=config.queue,
            queue_timeout=config.queue_timeout,
            slots=config.slots,
            speculator=speculator,
        )
