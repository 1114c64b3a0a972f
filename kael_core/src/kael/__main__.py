"""``python -m kael``: ``info`` (plugins, backends, devices), ``generate``, ``chat``, ``export-gguf`` and ``--version``."""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["cpu_isa", "info", "main", "version_text"]


def info(out: Any = None) -> int:
    import numpy as np

    import kael
    from kael._plugins import manager

    out = out or sys.stdout

    def p(s: str = "") -> None:
        print(s, file=out)

    p(
        f"kael {kael.__version__}  (Python {platform.python_version()}, NumPy {np.__version__}, "
        f"{platform.system()} {platform.machine()})"
    )
    manager.ensure_loaded("kael.backends")
    manager.ensure_loaded("kael.plugins")
    manager.ensure_loaded("kael.models")
    p("\nplugins:")
    if not manager.records:
        p("  (none installed)")
    for rec in sorted(manager.records.values(), key=lambda r: (r.group, r.name)):
        extra = f": {rec.error}" if rec.error else ""
        dist = f" [{rec.dist} {rec.version}]" if rec.dist else ""
        p(f"  {rec.group:14} {rec.name:12} {rec.status}{dist}{extra}")
    p("\nbackends:")
    for b in manager.backends:
        ok, reason = b.is_available()
        state = "available" if ok else f"unavailable ({reason})"
        p(f"  {b.name:12} device={b.device_type:6} priority={b.priority:<4} api={b.api_version}  {state}")
    p("\ndevices:")
    for dtype in sorted({b.device_type for b in manager.backends}):
        try:
            chosen = manager.select(dtype)
            n = chosen.device_count()
            p(f"  {dtype:6} served by {chosen.name!r} ({n} device{'s' if n != 1 else ''})")
        except kael.KaelError as exc:
            p(f"  {dtype:6} not usable: {exc}")
    cpu_isa(p)
    p("\nmodel families (config.json model_type, GGUF general.architecture):")
    try:
        for name, fam in sorted(kael.models.families().items()):
            gguf = ", ".join(fam.gguf_architectures) or "-"
            p(f"  {name:12} {gguf:12} {fam.description}")
    except kael.KaelError as exc:
        p(f"  not usable: {exc}")
    return 0


def cpu_isa(p: Callable[[str], None]) -> None:
    """The CPU backend's vector table and the CPU features it saw (``kael.cpu.isa_info``), when it has them."""
    import kael

    try:
        info = kael.cpu.isa_info()
    except kael.KaelError as exc:
        p(f"\ncpu vector table: not usable: {exc}")
        return
    if info is None:
        return
    env = [
        f"{k}={info[v]}" for k, v in (("KAEL_CPU_ISA", "requested"), ("KAEL_CPU_DISABLE", "disabled")) if info.get(v)
    ]
    forced = f" ({', '.join(env)})" if env else ""
    if info.get("isa"):
        p(f"\ncpu vector table: {info['isa']}{forced}")
    else:
        p(f"\ncpu vector table: none{forced}: {info.get('error')}")
    p(f"  compiled in: {', '.join(info.get('tables', []))}; this CPU runs: {', '.join(info.get('runnable', []))}")
    features = info.get("features", {})
    p(f"  CPU features: {' '.join(name for name, on in features.items() if on) or '(none of those checked)'}")


def version_text() -> str:
    """``kael X (Python Y, NumPy Z)``: what ``python -m kael --version`` prints."""
    from importlib import metadata

    try:
        numpy = metadata.version("numpy")
    except metadata.PackageNotFoundError:
        numpy = "not installed"
    from kael import __version__

    return f"kael {__version__} (Python {platform.python_version()}, NumPy {numpy})"


def _weights() -> tuple[str, ...]:
    """kael.models' weights choices (kael/models/_weights.py), for the --weights flags."""
    from kael.models import WEIGHTS

    return WEIGHTS


def _speculation_flags(p: argparse.ArgumentParser) -> None:
    """``--speculative``, ``--draft-model`` and ``--spec-tokens`` of ``generate`` and ``chat`` (as kael-server's)."""
    p.add_argument(
        "--speculative",
        choices=["ngram", "draft"],
        default=None,
        help="speculative decoding: 'ngram' drafts what followed the latest repeat of the last tokens "
        "(prompt lookup), 'draft' what --draft-model predicts; the drafts are verified in one step and "
        "the tokens are those without it (the prompt and new tokens must then fit the context)",
    )
    p.add_argument(
        "--draft-model",
        default=None,
        help="with --speculative draft: a smaller model sharing the tokenizer (a checkpoint directory or a "
        "bundled model's name)",
    )
    p.add_argument(
        "--spec-tokens",
        type=int,
        default=4,
        help="with --speculative, the most tokens drafted per step (1..15, default 4)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kael", description="kael command line")
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="list plugins, backends and devices")
    g = sub.add_parser("generate", help="generate text with a model checkpoint (any family), streamed to stdout")
    g.add_argument("prompt", help="the prompt text")
    g.add_argument(
        "--model",
        required=True,
        help="checkpoint directory (config.json, model.safetensors, and tokenizer.json or vocab.json + merges.txt), "
        "or a bundled model's name (kael-tiny, kael-tiny-chat with kael-server installed)",
    )
    g.add_argument(
        "--max-tokens",
        type=int,
        default=64,
        help="number of new tokens (default 64); past the model's context, each new token sees the last "
        "context-many tokens (a sliding window)",
    )
    g.add_argument(
        "--truncate-prompt",
        action="store_true",
        help="a prompt longer than the model's context keeps its last context-many tokens "
        "(without it, such a prompt is refused, as kael-server refuses it)",
    )
    g.add_argument("--temperature", type=float, default=0.0, help="0 for greedy, else >= 0.001 (default 0)")
    g.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens; 0 disables")
    g.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    _speculation_flags(g)
    g.add_argument("--device", default="cpu", help="device to run on (default cpu)")
    g.add_argument(
        "--weights",
        default=None,
        choices=_weights(),
        help="load the weights in this format: f32, bf16, f16, or GGML's q8_0 / q4_0 blocks (projections and "
        "token table, as llama.cpp's default quantization; norms and biases stay float32). Default: as stored",
    )
    c = sub.add_parser(
        "chat",
        help="chat with a model in the terminal: each line of stdin is a message, replies are streamed",
        description="Each line read from stdin is a user message; the reply is streamed to stdout. "
        "The whole conversation is rendered with the checkpoint's chat template each turn. "
        "/reset forgets the conversation, /exit (or end of input) ends the chat.",
    )
    c.add_argument(
        "--model",
        required=True,
        help="checkpoint directory with a chat template (tokenizer_config.json's chat_template or chat_template.jinja), "
        "or a bundled model's name (kael-tiny-chat with kael-server installed)",
    )
    c.add_argument("--system", default=None, help="a system message that starts the conversation")
    c.add_argument("--max-tokens", type=int, default=256, help="most tokens per reply (default 256)")
    c.add_argument("--temperature", type=float, default=0.0, help="0 for greedy (default), else >= 0.001")
    c.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: in (0, 1], 1 disables (default)")
    c.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    c.add_argument("--device", default="cpu", help="device to run on (default cpu)")
    _speculation_flags(c)
    c.add_argument(
        "--weights",
        default=None,
        choices=_weights(),
        help="load the weights in this format: f32, bf16, f16, or GGML's q8_0 / q4_0 blocks (projections and "
        "token table, as llama.cpp's default quantization; norms and biases stay float32). Default: as stored",
    )
    x = sub.add_parser(
        "export-gguf",
        help="write a checkpoint directory and its tokenizer as a GGUF file that llama.cpp loads",
    )
    x.add_argument("model", help="checkpoint directory (GPT-2 or a Llama-family model, with its tokenizer)")
    x.add_argument("out", help="the .gguf file to write")
    x.add_argument(
        "--weights",
        default=None,
        choices=_weights(),
        help="weight format of the projections and token table (default: as the checkpoint holds them)",
    )
    args = parser.parse_args(argv)
    if args.cmd == "info":
        return info()
    if args.cmd == "chat":
        from kael.models._cli import chat_cli

        return chat_cli(args)
    if args.cmd == "export-gguf":
        from kael.models._gguf_save import export_gguf_cli

        return export_gguf_cli(args)
    from kael.models._cli import generate_cli

    return generate_cli(args)


if __name__ == "__main__":
    sys.exit(main())
