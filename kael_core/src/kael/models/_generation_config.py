"""A checkpoint's ``generation_config.json``: end-of-sequence ids and default sampling settings.

Hugging Face writes it beside ``config.json`` (``GenerationConfig.save_pretrained``, or
``model.save_pretrained``); it is where chat models name their end-of-turn tokens
(``eos_token_id`` may be one id or a list). ``read_generation_config`` keeps the fields
kael's generation uses and ignores the rest; an absent field is None, an absent file an
empty ``GenerationConfig``. A field of the wrong type or range is a ``kael.FormatError``
naming the file and the field.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from .._errors import FormatError

__all__ = ["GENERATION_CONFIG_NAME", "GenerationConfig", "read_generation_config"]

GENERATION_CONFIG_NAME = "generation_config.json"


@dataclass(frozen=True)
class GenerationConfig:
    """Generation defaults of a checkpoint; every field is None (or empty) when the file leaves it out."""

    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    max_length: int | None = None
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    do_sample: bool | None = None
    repetition_penalty: float | None = None


def _is_int(x: object) -> bool:
    return type(x) is int  # not bool, not float


def read_generation_config(directory: str | os.PathLike[str]) -> GenerationConfig:
    """The ``generation_config.json`` of a checkpoint directory (or that file itself)."""
    p = Path(directory)
    if p.is_dir():
        p = p / GENERATION_CONFIG_NAME
    where = f"{GENERATION_CONFIG_NAME} {os.fspath(p)!r}"
    if not p.exists():
        return GenerationConfig()

    def fail(field: str | None, detail: str) -> NoReturn:
        raise FormatError(f"{where}: {field + ': ' if field else ''}{detail}")

    try:
        raw = p.read_bytes()
    except OSError as exc:
        fail(None, f"cannot read it ({exc.strerror or exc})")
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        fail(None, f"not UTF-8 JSON ({exc})")
    if not isinstance(d, dict):
        fail(None, f"expected a JSON object, got {type(d).__name__}")

    def token_id(field: str, v: object) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            fail(field, f"expected a non-negative integer token id, got {v!r}")
        return v

    def opt_int(field: str, lowest: int) -> int | None:
        v = d.get(field)
        if v is None:
            return None
        if not _is_int(v) or v < lowest:
            fail(field, f"expected an integer >= {lowest}, got {v!r}")
        return int(v)

    def opt_float(field: str, lowest: float, highest: float, *, open_low: bool) -> float | None:
        v = d.get(field)
        if v is None:
            return None
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if ok:
            ok = (v > lowest if open_low else v >= lowest) and v <= highest
        if not ok:
            low = "(" if open_low else "["
            fail(field, f"expected a number in {low}{lowest}, {highest}], got {v!r}")
        return float(v)

    eos: Any = d.get("eos_token_id")
    if eos is None:
        eos_ids: tuple[int, ...] = ()
    elif isinstance(eos, list):
        eos_ids = tuple(token_id("eos_token_id", v) for v in eos)
    else:
        eos_ids = (token_id("eos_token_id", eos),)
    bos, pad = d.get("bos_token_id"), d.get("pad_token_id")
    do_sample = d.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        fail("do_sample", f"expected true or false, got {do_sample!r}")
    return GenerationConfig(
        eos_token_ids=eos_ids,
        bos_token_id=None if bos is None else token_id("bos_token_id", bos),
        pad_token_id=None if pad is None else token_id("pad_token_id", pad),
        max_length=opt_int("max_length", 1),
        max_new_tokens=opt_int("max_new_tokens", 1),
        temperature=opt_float("temperature", 0.0, math.inf, open_low=False),
        top_p=opt_float("top_p", 0.0, 1.0, open_low=True),
        top_k=opt_int("top_k", 0),
        do_sample=do_sample,
        repetition_penalty=opt_float("repetition_penalty", 0.0, math.inf, open_low=True),
    )
