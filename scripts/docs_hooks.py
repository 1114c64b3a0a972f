"""mkdocs hooks of the documentation site (``hooks:`` in mkdocs.yml): the CLI page from argparse.

A page line ``<!-- kael-cli: NAME -->`` is replaced, at build time, by the usage line and a
table of every argument of the command NAME's parser (and of each of its sub-commands):
``kael-server`` (``kael_server.cli.build_parser``), ``python -m kael_server.ray`` (its Ray Serve
deployment) and ``python -m kael`` (the parser that ``kael.__main__.main`` builds). A flag added
to any parser appears in the next build, with nothing copied into the docs.

The server's parsers are derived from ``kael_server.config.ServerConfig`` (every flag declared
once); their pages also get the table of the config's Python fields (``load_app`` keywords,
``RayServeConfig`` fields), rendered from the same declaration.

NOTE [capturing the kael parser]: ``kael.__main__`` builds its parser inside ``main`` and
has no builder function. :func:`kael_parser` uses ``build_parser()`` when the module has
one; until then it runs ``main([])`` with ``ArgumentParser.parse_args`` patched to raise
with the parser it was called on, so the real parser object is read and no command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable
from typing import Any, NoReturn
from unittest import mock

__all__ = [
    "COMMANDS",
    "SETTINGS",
    "cli_markdown",
    "kael_parser",
    "on_page_markdown",
    "ray_parser",
    "ray_settings",
    "server_parser",
    "server_settings",
]

MARKER = re.compile(r"<!--\s*kael-cli:\s*(?P<name>[\w.-]+(?: -m [\w.-]+)?)\s*-->")


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def kael_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m kael`` (NOTE [capturing the kael parser])."""
    import kael.__main__ as cli

    build = getattr(cli, "build_parser", None)
    if callable(build):
        parser = build()
        assert isinstance(parser, argparse.ArgumentParser)
        return parser

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> NoReturn:
        raise _Captured(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", capture):
        try:
            cli.main([])
        except _Captured as captured:
            return captured.parser
    raise RuntimeError("kael.__main__.main returned without parsing its arguments")


def server_parser() -> argparse.ArgumentParser:
    """The parser of ``kael-server``."""
    from kael_server.cli import build_parser

    return build_parser()


def ray_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m kael_server.ray`` (``kael-server-ray``)."""
    from kael_server.ray_config import build_parser

    return build_parser()


def server_settings() -> str:
    """The Python side of ``kael-server``'s flags: ServerConfig's fields."""
    from kael_server.config import settings_markdown

    intro = (
        "In Python each flag is a field of `kael_server.config.ServerConfig`, which `load_app` takes "
        '(or its fields as keywords: `load_app("kael-tiny", slots=2)`):'
    )
    return f"{intro}\n\n{settings_markdown()}\n"


def ray_settings() -> str:
    """The Python side of the Ray flags: RayServeConfig's own fields (it has ServerConfig's too)."""
    from kael_server.config import ServerConfig, settings_markdown
    from kael_server.ray_config import RayServeConfig

    own = [f.name for f in dataclasses.fields(RayServeConfig) if f.name not in ServerConfig.__dataclass_fields__]
    intro = "`kael_server.ray.RayServeConfig` is a `ServerConfig` (every `kael-server` field above) plus these fields:"
    return f"{intro}\n\n{settings_markdown(RayServeConfig, own)}\n"


COMMANDS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "kael-server": server_parser,
    "python -m kael_server.ray": ray_parser,
    "python -m kael": kael_parser,
}
SETTINGS: dict[str, Callable[[], str]] = {"kael-server": server_settings, "python -m kael_server.ray": ray_settings}
"""The commands whose flags are a settings dataclass: the table of its Python fields follows theirs."""


def _cell(text: str) -> str:
    """Text for one Markdown table cell: pipes escaped, HTML and newlines neutralised."""
    text = " ".join(text.split())
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def _help(action: argparse.Action, prog: str) -> str:
    if not action.help:
        return ""
    text = str(action.help)
    if "%" in text:  # argparse's own help expansion: %(default)s, %(prog)s, %(choices)s, %%
        params = {**vars(action), "prog": prog}
        params = {k: getattr(v, "__name__", v) for k, v in params.items()}
        if action.choices is not None:
            params["choices"] = ", ".join(map(str, action.choices))
        text = text % params
    return text


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        return " \\| ".join(f"`{c}`" for c in action.choices)
    metavar = action.metavar or (action.dest if not action.option_strings else action.dest.upper())
    return f"`{metavar if isinstance(metavar, str) else ' '.join(metavar)}`"


def _default(action: argparse.Action) -> str:
    if action.required or action.nargs == 0 or action.default in (None, [], argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


def cli_markdown(parser: argparse.ArgumentParser, level: int = 2, title: str | None = None) -> str:
    """Markdown for ``parser``: a heading, its usage, description, a table of its arguments, its sub-commands.

    Every argument whose help is not suppressed gets a row (flags or name, value, default,
    help); each sub-command is rendered the same way one heading level down.
    """
    out = [f"{'#' * level} `{title or parser.prog}`", ""]
    out += ["```text", parser.format_usage().strip(), "```", ""]
    if parser.description:
        out += [" ".join(parser.description.split()), ""]
    rows = []
    subcommands: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:  # argparse has no public list of a parser's actions
        if isinstance(action, argparse._SubParsersAction):
            subcommands += list(action.choices.items())
            continue
        if action.help == argparse.SUPPRESS:
            continue
        names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
        rows.append(f"| {names} | {_value(action)} | {_default(action)} | {_cell(_help(action, parser.prog))} |")
    if rows:
        out += ["| argument | value | default | meaning |", "|---|---|---|---|", *rows, ""]
    for name, sub in subcommands:
        out += [cli_markdown(sub, level + 1, f"{parser.prog} {name}")]
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs hook: replace each ``<!-- kael-cli: NAME -->`` line with NAME's generated reference."""

    def render(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in COMMANDS:
            raise ValueError(f"docs: unknown command {name!r} in a kael-cli marker, expected one of {list(COMMANDS)}")
        text = cli_markdown(COMMANDS[name](), title=name)
        return f"{text}\n{SETTINGS[name]()}" if name in SETTINGS else text

    return MARKER.sub(render, markdown)
