"""ServerConfig: every ``kael-server`` flag, declared once.

Each field carries its flag(s), help text, default, choices and check (kael_server.settings).
From this one declaration come ``kael-server``'s argparse parser (:func:`add_server_arguments`),
the configuration ``load_app`` builds the app from, the Ray Serve deployment's (``RayServeConfig``
extends this class with Ray's own settings) and the docs' CLI page (generated from the parser
and from :func:`settings_markdown`). A flag added here reaches all four.

A value given in Python is checked when the config is built: ServerConfigError names the
flag, the value and what was expected (``--slots must be an integer >= 1, got 0``).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, get_args

from kael_server.auth import ENV_VAR, ApiKeys, configured_keys
from kael_server.deadline import check_request_timeout
from kael_server.errors import ServerConfigError
from kael_server.logs import LogFormat
from kael_server.settings import (
    Choice,
    Flag,
    Integer,
    Names,
    Number,
    Rule,
    Switch,
    Text,
    add_arguments,
    build_from_args,
    check_settings,
    setting,
    settings_of,
)

__all__ = [
    "LOG_LEVELS",
    "MAX_PORT",
    "WEIGHTS",
    "ApiKeyRule",
    "PortRule",
    "SPECULATIVE",
    "ServerConfig",
    "SpecTokensRule",
    "TimeoutRule",
    "add_server_arguments",
    "settings_markdown",
]

MAX_PORT = 65535
WEIGHTS = (
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
    "iq4_nl", "iq4_xs", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m",
)  # fmt: skip
"""``--weights`` choices: ``kael.models.WEIGHTS`` (named here so the web stack imports without kael)."""
LOG_LEVELS = ("debug", "info", "warning", "error")
SPECULATIVE = ("ngram", "draft")
"""``--speculative`` methods: prompt lookup (``kael.engine.NgramProposer``) and a draft model
(``kael.engine.DraftModelProposer``, ``--draft-model``)."""
MAX_SPEC_TOKENS = 15
"""Drafts per verification at most: 1 + 15 query rows, the most whose kernels match one at a time."""

_Config = TypeVar("_Config", bound="ServerConfig")


@dataclass(frozen=True)
class PortRule(Rule):
    """A TCP port, 1 to 65535 (checked after parsing, so the refusal is ``kael-server``'s one line)."""

    def argparse_type(self) -> type[int]:
        return int

    def check(self, flag: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PORT:
            raise ServerConfigError(f"{flag} must be a TCP port from 1 to {MAX_PORT}, got {value!r}")
        return value


@dataclass(frozen=True)
class SpecTokensRule(Integer):
    """Draft tokens per verification: an integer from 1 to MAX_SPEC_TOKENS."""

    minimum: int = 1

    def _parse(self, text: str) -> int:
        value = super()._parse(text)
        if value > MAX_SPEC_TOKENS:
            raise argparse.ArgumentTypeError(f"must be at most {MAX_SPEC_TOKENS}, got {value}")
        return value

    def check(self, flag: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SPEC_TOKENS:
            raise ServerConfigError(f"{flag} must be an integer from 1 to {MAX_SPEC_TOKENS}, got {value!r}")
        return value


@dataclass(frozen=True)
class TimeoutRule(Rule):
    """Seconds in (0, one day] (kael_server.deadline), checked after parsing."""

    def argparse_type(self) -> type[float]:
        return float

    def check(self, flag: str, value: Any) -> Any:
        try:
            check_request_timeout(value)
        except ValueError as exc:
            raise ServerConfigError(f"{flag}: {exc}") from None
        return value


@dataclass(frozen=True)
class ApiKeyRule(Rule):
    """API keys: an ApiKeys, or the keys themselves (kept as their digests, never as text)."""

    def check(self, flag: str, value: Any) -> Any:
        if isinstance(value, ApiKeys):
            return value
        if isinstance(value, str | bytes) or not isinstance(value, Iterable):
            raise ServerConfigError(f"{flag} must be a list of keys or an ApiKeys, got {type(value).__name__}")
        return ApiKeys(value, flag)


def _keys_from_args(args: argparse.Namespace) -> ApiKeys:
    return configured_keys(args.api_key, args.api_key_file)


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """What ``kael-server`` serves and how: one field per flag (``--kv-cache-tokens`` is
    ``kv_cache_tokens``; ``--no-prefix-cache`` is ``prefix_cache=False``; ``--api-key``,
    ``--api-key-file`` and the ``KAEL_API_KEY`` variable together are ``api_keys``).

    Built from parsed flags with :meth:`from_args`, or in Python (``ServerConfig(slots=4)``);
    either way every value is checked (ServerConfigError naming the flag).
    """

    data: str | None = setting(
        None,
        Flag(
            "--data",
            "checkpoint directory (config.json, model.safetensors, and tokenizer.json or vocab.json + "
            "merges.txt; a chat template for /v1/chat/completions), or the name of a bundled model: kael-tiny "
            "(the default) or kael-tiny-chat (a Llama-architecture model with a chat template), or a llama.cpp "
            "GGUF file (model.gguf: GPT-2, Llama or Qwen2 with its tokenizer)",
            metavar="DIR",
        ),
        rule=Text(path=True),
        optional=True,
    )
    served_model_name: tuple[str, ...] = setting(
        (),
        Flag(
            "--served-model-name",
            "the model's name in the OpenAI API (repeatable: the first is the name answers carry, each "
            "one is accepted in a request's model field and listed by /v1/models); default: the "
            "checkpoint's directory or file name. A request naming another model is a 404 model_not_found",
            metavar="NAME",
            action="append",
        ),
        rule=Names(),
    )
    device: str = setting("cpu", Flag("--device", "kael device to run the model on, e.g. cpu or cuda"), rule=Text())
    weights: str | None = setting(
        None,
        Flag(
            "--weights",
            "load the weights in this format: f32, bf16, f16, or GGML's q8_0 / q4_0 blocks (projections and "
            "token table, as llama.cpp's default quantization; norms and biases stay float32); default: as stored",
        ),
        rule=Choice(WEIGHTS),
        optional=True,
    )
    host: str = setting("127.0.0.1", Flag("--host", "address to listen on"), rule=Text())
    port: int = setting(8000, Flag("--port", f"TCP port to listen on (1 to {MAX_PORT})"), rule=PortRule())
    slots: int = setting(
        1,
        Flag(
            "--slots",
            "generations run at once: the largest batch; with N > 1 they share each decode step (continuous "
            "batching over a paged KV cache, which holds --kv-cache-tokens positions)",
            metavar="N",
        ),
        rule=Integer(1),
    )
    kv_cache_tokens: int | None = setting(
        None,
        Flag(
            "--kv-cache-tokens",
            "positions the paged KV cache holds in all, in blocks of 16 (default: N full contexts for "
            "--slots N); many short sequences fit where N full contexts would not; when it runs out, the "
            "newest sequence is preempted and recomputed later (same output)",
            metavar="T",
        ),
        rule=Integer(1),
        optional=True,
    )
    prefix_cache: bool = setting(
        True,
        Flag(
            "--no-prefix-cache",
            "do not reuse the keys and values of a prompt's cached prefix (automatic prefix caching is on "
            "by default with batching: blocks of the same tokens in the same model are shared)",
            action="store_true",
            dest="no_prefix_cache",
        ),
        rule=Switch(),
        from_args=lambda args: not args.no_prefix_cache,
    )
    speculative: str | None = setting(
        None,
        Flag(
            "--speculative",
            "speculative decoding: 'ngram' drafts the tokens that followed the latest n-gram earlier in the "
            "prompt or output (prompt lookup), 'draft' has --draft-model draft them; the model verifies them "
            "in one step, so outputs are the same tokens as without it; each request's draft length adapts to "
            "what is accepted and turns off when nothing is",
            metavar="METHOD",
        ),
        rule=Choice(SPECULATIVE),
        optional=True,
    )
    draft_model: str | None = setting(
        None,
        Flag(
            "--draft-model",
            "with --speculative draft, the model that drafts: a checkpoint directory, a bundled model's name or "
            "a GGUF file, sharing the served model's vocabulary (checked before the server listens)",
            metavar="DIR",
        ),
        rule=Text(path=True),
        optional=True,
    )
    spec_tokens: int = setting(
        4,
        Flag(
            "--spec-tokens",
            f"with --speculative, the most draft tokens per verification (1 to {MAX_SPEC_TOKENS})",
            metavar="K",
        ),
        rule=SpecTokensRule(),
    )
    queue: int = setting(
        64,
        Flag(
            "--queue",
            "requests that may wait for a busy slot (llama-server and vLLM queue too); beyond it, or past "
            "--queue-timeout, 429 with Retry-After",
            metavar="Q",
        ),
        rule=Integer(0),
    )
    queue_timeout: float = setting(
        10.0,
        Flag("--queue-timeout", "seconds a queued request waits for a slot before it is answered 429", metavar="S"),
        rule=Number(0, 3600),
    )
    request_timeout: float | None = setting(
        None,
        Flag(
            "--request-timeout",
            "seconds a generation may take from its request's arrival; past it, it stops and its slot is "
            "freed (a plain request gets 504, a stream a final error event); default: no limit",
            metavar="S",
        ),
        rule=TimeoutRule(),
        optional=True,
    )
    api_keys: ApiKeys = setting(  # noqa: RUF009 - setting() is a dataclasses.field
        dataclasses.MISSING,
        Flag(
            "--api-key",
            "require 'Authorization: Bearer KEY' on every generation and tokenizer route (repeatable: any "
            f"of the keys works); a key on the command line is visible to other local users, so prefer "
            f"--api-key-file or the {ENV_VAR} environment variable, which add keys the same way",
            metavar="KEY",
            action="append",
            dest="api_key",
        ),
        Flag(
            "--api-key-file",
            "a file of API keys, one a line (blank lines and lines starting with # are ignored)",
            metavar="FILE",
            dest="api_key_file",
        ),
        rule=ApiKeyRule(),
        from_args=_keys_from_args,
        default_factory=ApiKeys,
        repr=False,
        compare=False,
    )
    protect_metrics: bool = setting(
        False,
        Flag(
            "--protect-metrics",
            "with API keys, /metrics needs a key too (/health and /ready always stay open)",
            action="store_true",
        ),
        rule=Switch(),
    )
    log_format: LogFormat = setting(  # noqa: RUF009 - setting() is a dataclasses.field
        "console",
        Flag(
            "--log-format",
            "one line per event (each request, and uvicorn's own lines), as readable text or as JSON objects",
        ),
        rule=Choice(get_args(LogFormat)),
    )
    log_level: str = setting("info", Flag("--log-level", "lowest level of log lines written"), rule=Choice(LOG_LEVELS))

    def __post_init__(self) -> None:
        check_settings(self)

    @classmethod
    def from_args(cls: type[_Config], args: argparse.Namespace, **values: Any) -> _Config:
        """The config of parsed flags (from a parser :func:`add_server_arguments` built, or a
        subclass's), plus ``values`` for settings not read from flags; ServerConfigError for a
        bad value. Reads ``--api-key-file`` and ``KAEL_API_KEY``."""
        return build_from_args(cls, args, **values)

    def server(self) -> ServerConfig:
        """Only ``kael-server``'s settings (a subclass's config, such as Ray's, without its own)."""
        names = [f.name for f, _ in settings_of(ServerConfig)]
        return ServerConfig(**{name: getattr(self, name) for name in names})


def add_server_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Adds every ServerConfig flag to ``parser`` (help, metavar, choices, types and defaults)."""
    add_arguments(parser, ServerConfig)


def _shown_default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return "" if f.default is None else f"`{f.default}`"
    return "none" if f.name == "api_keys" else ""


def settings_markdown(cls: type[ServerConfig] = ServerConfig, names: Iterable[str] | None = None) -> str:
    """A Markdown table of ``cls``'s settings (only ``names``): the Python field (a ``load_app``
    keyword, a ``ServerConfig`` / ``RayServeConfig`` field), the flag(s) it comes from and its default."""
    rows = ["| field | flags | default |", "|---|---|---|"]
    for f, declared in settings_of(cls, names):
        flags = ", ".join(f"`{flag.name}`" for flag in declared.flags) or "(Python only)"
        rows.append(f"| `{f.name}` | {flags} | {_shown_default(f)} |")
    return "\n".join(rows)
