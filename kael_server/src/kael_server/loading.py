"""load_app: the server for a checkpoint directory of any kael model family, loaded with kael."""

from __future__ import annotations

import importlib.resources
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from litestar import Litestar

from kael_server.app import create_app
from kael_server.auth import ApiKeys
from kael_server.batching import BatchScheduler
from kael_server.deadline import check_request_timeout
from kael_server.errors import ServerConfigError
from kael_server.generator import Generator
from kael_server.metrics import Metrics

__all__ = [
    "BUNDLED_MODEL",
    "BUNDLED_MODELS",
    "CHECKPOINT_FILES",
    "TOKENIZER_FILES",
    "WEIGHTS",
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
WEIGHTS = ("f32", "bf16", "f16", "q8_0", "q4_0")
"""``--weights`` choices: ``kael.models.WEIGHTS`` (named here so the web stack imports without kael)."""


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
    data: str | Path | None,
    device: str = "cpu",
    *,
    on_load_error: Callable[[BaseException], None] | None = None,
    slots: int = 1,
    queue: int = 0,
    queue_timeout: float = 10.0,
    api_keys: ApiKeys | Sequence[str] = (),
    protect_metrics: bool = False,
    request_timeout: float | None = None,
    weights: str | None = None,
    kv_cache_tokens: int | None = None,
    prefix_cache: bool = True,
) -> Litestar:
    """The app serving the checkpoint in ``data`` (any family ``kael.models.from_pretrained`` knows by
    config.json's ``model_type``; any size: shapes come from config.json).

    The directory and the device are checked at once; the weights load on a thread after
    start-up, while ``/health`` answers and ``/ready`` says 503. The tokenizer is
    ``kael.tokenizer.load_tokenizer``'s (with the directory's chat template, which
    ``/v1/chat/completions`` needs); texts end at its end-of-text token and at every eos id of
    the model's ``generation_config``, chat replies also at the template's end-of-turn
    tokens (Generator). Raises ServerConfigError or
    ImportError (kael missing) before anything is served. ``api_keys``, ``protect_metrics``
    and ``request_timeout`` are create_app's.

    ``slots`` generations run at once: with more than one (or with a ``queue``), they share
    each decode step through a BatchScheduler over kael's ``BatchDecoder``; with one and no
    queue, the single-slot SlotPool runs ``model.generate`` as before.

    The batch scheduler keeps keys and values in kael's paged KV cache: ``kv_cache_tokens``
    positions in all (default: ``slots`` full contexts; at least one), in blocks of 16 shared by
    prefix unless ``prefix_cache`` is False (``--kv-cache-tokens``, ``--no-prefix-cache``); a
    ``kv_cache_tokens`` also turns batching on with one slot.

    ``weights`` (None: as stored; or one of WEIGHTS) loads the weights in that format
    (``kael.models.from_pretrained(weights=...)``, ``load_gguf(weights=...)``); ``/v1/models``
    reports the format the model holds.
    """
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ServerConfigError(f"--slots must be an integer >= 1, got {slots!r}")
    if kv_cache_tokens is not None and (
        isinstance(kv_cache_tokens, bool) or not isinstance(kv_cache_tokens, int) or kv_cache_tokens < 1
    ):
        raise ServerConfigError(f"--kv-cache-tokens must be an integer >= 1, got {kv_cache_tokens!r}")
    if weights is not None and weights not in WEIGHTS:
        raise ServerConfigError(f"--weights must be one of {list(WEIGHTS)}, got {weights!r}")
    if isinstance(queue, bool) or not isinstance(queue, int) or queue < 0:
        raise ServerConfigError(f"--queue must be an integer >= 0, got {queue!r}")
    if not 0 <= queue_timeout <= 3600:
        raise ServerConfigError(f"--queue-timeout must be between 0 and 3600 seconds, got {queue_timeout!r}")
    try:
        check_request_timeout(request_timeout)
    except ValueError as exc:
        raise ServerConfigError(f"--request-timeout: {exc}") from None
    path = checkpoint_dir(data)
    check_device(device)
    import kael  # imported here so the web stack imports without loading kael's models

    def load(metrics: Metrics) -> Generator:
        if path.is_file():  # GGUF: the family general.architecture names, the tokenizer from its metadata
            model, tokenizer = kael.models.load_gguf(path, device=device, weights=weights)
            if tokenizer is None:
                raise ServerConfigError(f"--data {str(path)!r}: this GGUF file has no tokenizer")
        else:
            # the family config.json's model_type names, its weights in the requested format
            model = kael.models.from_pretrained(path, device=device, weights=weights)
            tokenizer = kael.tokenizer.load_tokenizer(path)  # tokenizer.json, else vocab.json + merges.txt
        batched = slots > 1 or queue > 0 or kv_cache_tokens is not None
        if kv_cache_tokens is not None and kv_cache_tokens < model.max_positions:
            raise ServerConfigError(
                f"--kv-cache-tokens {kv_cache_tokens} cannot hold one sequence of the model's context "
                f"({model.max_positions} positions); give at least that many"
            )
        return Generator(
            model,
            tokenizer,
            device=device,
            model_name=path.name,  # seeds become kael.Generators (the Generator's default make_rng)
            metrics=metrics,
            make_scheduler=partial(_batch_scheduler, model, slots, queue, queue_timeout, kv_cache_tokens, prefix_cache)
            if batched
            else None,
        )

    return create_app(
        load,
        on_load_error=on_load_error,
        api_keys=api_keys,
        protect_metrics=protect_metrics,
        request_timeout=request_timeout,
    )


def _batch_scheduler(
    model: Any,
    slots: int,
    queue: int,
    queue_timeout: float,
    kv_cache_tokens: int | None,
    prefix_cache: bool,
    generator: Generator,
) -> BatchScheduler:
    """Continuous batching of up to ``slots`` sequences over kael's paged KV cache (BatchDecoder)."""
    from kael.models import BatchDecoder

    engine = BatchDecoder(model, slots, kv_cache_tokens=kv_cache_tokens, prefix_caching=prefix_cache)
    return BatchScheduler(generator, engine, queue=queue, queue_timeout=queue_timeout)
