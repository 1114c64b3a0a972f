"""Names of kael's top level that live in heavier sub-packages, imported on first access."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "GPT":
        from .models import GPT

        return GPT
    if name == "BpeTokenizer":
        from .tokenizer import BpeTokenizer

        return BpeTokenizer
    if name in ("load_safetensors", "save_safetensors"):
        from . import io

        return getattr(io, name)
    if name in ("set_num_threads", "get_num_threads"):
        from . import _threads

        return getattr(_threads, name)
    raise AttributeError(name)
