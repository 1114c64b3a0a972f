"""``python -m kael generate`` and ``python -m kael chat``: stream a model's text to stdout (any model family).

``generate`` continues one prompt; ``chat`` holds a conversation read line by line from
stdin, rendering the whole history with the checkpoint's chat template each turn. Text
is written as the tokens arrive. Byte-level tokenizers spell many characters with several
tokens, so the tokens go through the tokenizer's incremental UTF-8 decoder: a character is
written once its last byte has arrived, never half of it (bytes that can never form a
character are written as U+FFFD). Text ends at the tokenizer's end of text and at every eos
id of the checkpoint's ``generation_config.json``; a chat reply also at the template's
end-of-turn tokens. ``--model`` is a checkpoint directory or the name of a model a plugin
bundles (kael-server ships ``kael-tiny`` and ``kael-tiny-chat``), as ``kael-server --data`` accepts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, TextIO

from .._errors import KaelError

__all__ = [
    "bundled_models",
    "chat_cli",
    "fit_prompt",
    "generate_cli",
    "resolve_model",
    "speculative_of",
    "stop_ids",
    "stream_generation",
]


def bundled_models() -> dict[str, Path]:
    """The models plugins ship, by name (hook ``kael_bundled_models``; kael-server's ``kael-tiny``, ``kael-tiny-chat``)."""
    from .._plugins import manager

    manager.ensure_loaded("kael.plugins")
    found: dict[str, Path] = {}
    for models in manager.pm.hook.kael_bundled_models():
        found.update({str(name): Path(path) for name, path in models.items()})
    return found


def resolve_model(model: str) -> str:
    """``model`` itself when it names an existing path, else the directory of the bundled model of
    that name, else ``model`` unchanged (loading it then reports what is missing)."""
    if Path(model).exists():
        return model
    path = bundled_models().get(model)
    return str(path) if path is not None else model


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
    stop_tokens: Collection[int] | None = None,
    sampler: Any = None,
    speculative: Any = None,
) -> list[int]:
    """Generate and write the text to ``out`` as it comes; return the new token ids.

    Generation stops at a stop token (not written): ``stop_tokens``, or the tokenizer's
    ``eot_token`` when they are None and ``stop_at_eot``. ``sampler`` and ``speculative`` are
    ``generate``'s.
    """
    decoder = tokenizer.incremental_decoder()
    stops = (
        frozenset(stop_tokens) if stop_tokens is not None else frozenset([tokenizer.eot_token] if stop_at_eot else [])
    )

    def on_token(token: int) -> bool:
        if token in stops:
            return False
        _write(out, decoder.add(token))
        return True

    extra: dict[str, Any] = {} if sampler is None else {"sampler": sampler}
    if speculative is not None:
        extra["speculative"] = speculative
    ids = model.generate(
        prompt_ids,
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        on_token=on_token,
        generator=generator,
        **extra,
    )
    _write(out, decoder.flush())
    return list(ids)


def stop_ids(model: Any, tokenizer: Any, template: Any = None) -> tuple[int, ...]:
    """The ids that end a text: the tokenizer's ``eot_token`` (when it has one), every eos id of
    ``model.generation_config`` and, with a chat ``template``, its end-of-turn tokens."""
    ids: list[int] = []
    try:
        ids.append(int(tokenizer.eot_token))
    except KaelError:  # neither an eos token nor <|endoftext|>
        pass
    config = getattr(model, "generation_config", None)
    ids += [int(t) for t in getattr(config, "eos_token_ids", None) or ()]
    if template is not None:
        ids += template.end_of_turn_tokens(tokenizer)
    return tuple(dict.fromkeys(ids))


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
    from ..tokenizer import load_tokenizer
    from ._generate import check_sampling
    from ._registry import from_pretrained

    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        if args.max_tokens < 0:
            raise KaelError(f"--max-tokens must be >= 0, got {args.max_tokens}")
        check_sampling(args.temperature, args.top_k, None, "generate")
        args.model = resolve_model(args.model)
        model = from_pretrained(args.model, device=args.device, mmap=True, weights=getattr(args, "weights", None))
        tokenizer = load_tokenizer(args.model)  # tokenizer.json, else vocab.json + merges.txt
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
            stop_tokens=stop_ids(model, tokenizer),
            speculative=speculative_of(args, model),
        )
        _write(out, "\n")
    except (KaelError, OSError) as exc:
        print(f"error: {exc}", file=err)
        return 1
    return 0


def speculative_of(args: argparse.Namespace, model: Any) -> Any:
    """The ``generate(speculative=...)`` of ``--speculative``/``--draft-model``/``--spec-tokens`` (None without
    them): ``kael.engine.speculator_for``'s Speculator; KaelError naming the flag."""
    from ..engine import MAX_DRAFT_TOKENS, speculator_for
    from ._registry import from_pretrained

    kind, draft = getattr(args, "speculative", None), getattr(args, "draft_model", None)
    k = getattr(args, "spec_tokens", 4)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_DRAFT_TOKENS:
        raise KaelError(f"--spec-tokens must be an integer in 1..{MAX_DRAFT_TOKENS}, got {k!r}")
    if kind == "draft" and draft is None:
        raise KaelError("--speculative draft needs --draft-model DIR (the model that drafts)")
    if draft is not None and kind != "draft":
        raise KaelError("--draft-model needs --speculative draft")
    if kind is None:
        return None
    drafter = from_pretrained(resolve_model(str(draft)), device=model.device) if kind == "draft" else None
    try:
        return speculator_for(kind, k, drafter, target=model)
    except KaelError as exc:
        raise KaelError(f"--draft-model {draft!r}: {exc}") from None


CHAT_COMMANDS = {
    "/exit": "end the chat (as does end of input)",
    "/reset": "forget the conversation (the system text stays)",
}


def chat_cli(
    args: argparse.Namespace, inp: TextIO | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run ``chat`` with parsed arguments (see ``kael.__main__``): 0 at the end of input or
    ``/exit``, 1 on an error, 2 when the checkpoint has no chat template, 130 on Ctrl-C.

    Each line read from ``inp`` is a user message; the whole conversation (with ``--system``
    first) is rendered by the template with the generation prompt and the reply streamed to
    ``out``, then a newline. A turn that no longer fits the context is refused (on ``err``) and
    left out of the conversation. On a terminal a ``> `` prompt is shown before each line.
    """
    from ..engine import SamplingParams, TokenSampler
    from ..ops import Generator
    from ..tokenizer import encode_chat, load_tokenizer
    from ._generate import check_sampling
    from ._registry import from_pretrained

    inp = inp if inp is not None else sys.stdin
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        if args.max_tokens < 1:
            raise KaelError(f"--max-tokens must be >= 1, got {args.max_tokens}")
        check_sampling(args.temperature, 0, None, "chat")
        if not 0 < args.top_p <= 1:
            raise KaelError(f"--top-p must be in (0, 1], got {args.top_p}")
        args.model = resolve_model(args.model)
        tokenizer = load_tokenizer(args.model)
        template = tokenizer.chat_template
        if template is None:
            print(
                f"error: {args.model!r} has no chat template: add a chat_template to its tokenizer_config.json "
                "or a chat_template.jinja file (or use `python -m kael generate`)",
                file=err,
            )
            return 2
        model = from_pretrained(args.model, device=args.device, mmap=True, weights=getattr(args, "weights", None))
        speculative = speculative_of(args, model)
        stops = stop_ids(model, tokenizer, template)
        generator = Generator(args.device).manual_seed(args.seed) if args.seed is not None else None
        if generator is None and args.temperature > 0:
            generator = Generator(args.device)  # fresh entropy; one stream for the whole chat
        start = [{"role": "system", "content": args.system}] if args.system else []
        history = list(start)
        interactive = bool(getattr(inp, "isatty", lambda: False)())
        while True:
            if interactive:
                _write(out, "> ")
            line = inp.readline()
            if not line:
                break
            text = line.rstrip("\r\n")
            if text.strip() == "/exit":
                break
            if text.strip() == "/reset":
                history = list(start)
                print("(conversation cleared)", file=err)
                continue
            if not text.strip():
                continue
            turn = [*history, {"role": "user", "content": text}]
            ids = encode_chat(tokenizer, template.render(turn, add_generation_prompt=True))
            room = model.max_positions - len(ids)
            if room < 1:
                print(
                    f"error: the conversation is {len(ids)} tokens, which leaves no room in the model's "
                    f"context of {model.max_positions}; /reset starts again",
                    file=err,
                )
                continue
            sampler = None
            if args.top_p < 1 and args.temperature > 0:
                sampler = TokenSampler(SamplingParams(temperature=args.temperature, top_p=args.top_p), (), generator)
            new = stream_generation(
                model,
                tokenizer,
                ids,
                min(args.max_tokens, room),
                out,
                temperature=args.temperature,
                generator=generator,
                stop_tokens=stops,
                sampler=sampler,
                speculative=speculative,
            )
            _write(out, "\n")
            reply = _reply_ids(new, stops)
            history = [*turn, {"role": "assistant", "content": tokenizer.decode_text(reply)}]
    except (KaelError, OSError) as exc:
        print(f"error: {exc}", file=err)
        return 1
    except KeyboardInterrupt:  # Ctrl-C in a terminal: end the line, no traceback
        _write(out, "\n")
        return 130
    return 0


def _reply_ids(new: Sequence[int], stops: Collection[int]) -> list[int]:
    """The generated ids up to (without) the first stop token."""
    reply: list[int] = []
    for token in new:
        if token in stops:
            break
        reply.append(token)
    return reply
