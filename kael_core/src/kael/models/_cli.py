"""``python -m kael generate``: stream a model's continuation of a prompt to stdout (any model family).

Text is written as the tokens arrive. GPT-2 spells many characters with several
byte-level tokens, so the tokens go through the tokenizer's incremental UTF-8
decoder: a character is written once its last byte has arrived, never half of it
(bytes that can never form a character are written as U+FFFD).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from .._errors import KaelError

__all__ = ["fit_prompt", "generate_cli", "stream_generation"]


def _write(out: TextIO, text: str) -> None:
    if not text:
        return
    buf = getattr(out, "buffer", None)
    enc = (getattr(out, "encoding", None) or "").lower().replace("-", "")
    if buf is not None and enc != "utf8":
        # A terminal or pipe whose encoding is not UTF-8 would raise on most generated text.
        out.flush()
        buf.write(text.encode("utf-8"))
        buf.flush()
    else:
        out.write(text)
        out.flush()


def stream_generation(
    model: Any,
    tokenizer: Any,
    prompt_ids: list[int],
    max_new_tokens: int,
    out: TextIO,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    generator: Any = None,
    stop_at_eot: bool = True,
) -> list[int]:
    """Generate and write the text to ``out`` as it comes; return the new token ids.

    Generation stops at ``<|endoftext|>`` (not written) when ``stop_at_eot``.
    """
    decoder = tokenizer.incremental_decoder()
    eot = tokenizer.eot_token if stop_at_eot else None

    def on_token(token: int) -> bool:
        if token == eot:
            return False
        _write(out, decoder.add(token))
        return True

    ids = model.generate(
        prompt_ids, max_new_tokens, temperature=temperature, top_k=top_k, on_token=on_token, generator=generator
    )
    _write(out, decoder.flush())
    return list(ids)


def fit_prompt(ids: list[int], context: int, truncate: bool = False) -> list[int]:
    """``ids`` if they fit the model's context; its last ``context`` ids with ``truncate``;
    otherwise a KaelError, as kael-server refuses such a prompt."""
    if len(ids) <= context:
        return ids
    if truncate:
        return ids[-context:]
    raise KaelError(
        f"the prompt is {len(ids)} tokens, more than the model's context of {context} tokens; "
        f"shorten it, or pass --truncate-prompt to keep its last {context} tokens"
    )


def generate_cli(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``generate`` with parsed arguments (see ``kael.__main__``); 0 on success, 1 on an error."""
    from ..ops import Generator
    from ..tokenizer import BpeTokenizer
    from ._generate import check_sampling
    from ._registry import from_pretrained

    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        if args.max_tokens < 0:
            raise KaelError(f"--max-tokens must be >= 0, got {args.max_tokens}")
        check_sampling(args.temperature, args.top_k, None, "generate")
        model = from_pretrained(args.model, device=args.device, mmap=True)
        tokenizer = BpeTokenizer.from_directory(args.model)
        ids = tokenizer.encode(args.prompt)
        if not ids:  # GPT-2 starts unconditional text after <|endoftext|>
            ids = [tokenizer.eot_token]
        ids = fit_prompt(ids, model.max_positions, truncate=getattr(args, "truncate_prompt", False))
        generator = Generator(args.device).manual_seed(args.seed) if args.seed is not None else None
        stream_generation(
            model,
            tokenizer,
            ids,
            args.max_tokens,
            out,
            temperature=args.temperature,
            top_k=args.top_k,
            generator=generator,
        )
        _write(out, "\n")
    except (KaelError, OSError) as exc:
        print(f"error: {exc}", file=err)
        return 1
    return 0
