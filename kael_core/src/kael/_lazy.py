"""Names of kael's top level that live in heavier sub-packages, imported on first access.

``kael.set_num_threads`` and ``kael.get_num_threads`` are ``kael.cpu``'s functions (the
one home of the CPU thread and memory controls).
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []


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
        from . import cpu

        return getattr(cpu, name)
    raise AttributeError(name)
