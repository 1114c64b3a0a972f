"""docs/cli.md is generated from the commands' argparse parsers (scripts/docs_hooks.py), not copied."""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kael_docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of a parser and of its sub-commands' parsers."""
    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _options(sub)
        elif action.help != argparse.SUPPRESS:
            found |= set(action.option_strings)
    return found


def test_the_cli_page_has_every_flag_of_both_commands(hooks: ModuleType) -> None:
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    rendered = hooks.on_page_markdown(page, None, None, None)
    assert "kael-cli:" not in rendered  # every marker replaced
    pytest.importorskip("kael_server")
    from kael_server.cli import build_parser

    for parser in (build_parser(), hooks.kael_parser()):
        for option in _options(parser):
            assert f"`{option}`" in rendered, option
    for sub in ("info", "generate", "chat", "export-gguf"):
        assert f"## `python -m kael {sub}`" in rendered
    assert "usage: kael-server" in rendered and "usage: python -m kael generate" in rendered


def test_the_kael_parser_is_captured_without_running_a_command(
    hooks: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = hooks.kael_parser()
    assert parser.prog == "python -m kael"
    assert capsys.readouterr().out == ""  # `info` would have printed
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    generate = sub.choices["generate"]
    assert generate.parse_args(["hi", "--model", "m", "--max-tokens", "3"]).max_tokens == 3
    assert argparse.ArgumentParser.parse_args.__name__ == "parse_args"  # the patch is undone


def test_a_new_flag_appears_with_its_value_default_and_help(hooks: ModuleType) -> None:
    parser = argparse.ArgumentParser(prog="demo", description="A demo   command.")
    parser.add_argument("path", help="where <it> is")
    parser.add_argument("--mode", choices=("a", "b"), default="a", help="mode (default %(default)s)")
    parser.add_argument("--limit", metavar="N", type=int, default=5, help="at most N | more")
    parser.add_argument("--flag", action="store_true", help="turn it on")
    parser.add_argument("--hidden", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("run", help="run it").add_argument("--fast", action="store_true", help="quickly")
    text = hooks.cli_markdown(parser)
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert rows == [
        "| `-h`, `--help` |  |  | show this help message and exit |",
        "| `path` | `path` |  | where &lt;it&gt; is |",
        "| `--mode` | `a` \\| `b` | `a` | mode (default a) |",
        "| `--limit` | `N` | `5` | at most N \\| more |",
        "| `--flag` |  |  | turn it on |",
        "| `-h`, `--help` |  |  | show this help message and exit |",
        "| `--fast` |  |  | quickly |",
    ]
    assert text.startswith("## `demo`\n")
    assert "A demo command." in text and "--hidden" not in text
    assert re.search(r"^### `demo run`$", text, flags=re.M)


def test_an_unknown_command_in_a_marker_is_an_error(hooks: ModuleType) -> None:
    with pytest.raises(ValueError, match="unknown command 'nosuch'"):
        hooks.on_page_markdown("<!-- kael-cli: nosuch -->", None, None, None)
