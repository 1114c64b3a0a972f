"""ServerConfig: every kael-server flag declared once, and derived into the parser, load_app, Ray Serve and the docs.

The tests walk the declaration itself (kael_server.settings), so a setting added to ServerConfig
is checked with nothing written here: it must parse back from ``kael-server``'s flags and from
the Ray command's, reach ``load_app`` and each Ray replica unchanged, be listed on the docs' CLI
page, and be refused with its flag named when its value is bad.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kael_server.auth import ApiKeys
from kael_server.cli import build_parser
from kael_server.config import PortRule, ServerConfig, TimeoutRule, settings_markdown
from kael_server.errors import ServerConfigError
from kael_server.loading import load_app
from kael_server.ray_config import RayCluster, RayServeConfig
from kael_server.ray_config import build_parser as ray_build_parser
from kael_server.settings import (
    Choice,
    Flag,
    Integer,
    Names,
    Number,
    Setting,
    Switch,
    Text,
    add_arguments,
    setting,
    settings_of,
)
from litestar.testing import TestClient

from .conftest import poll_until

ROOT = Path(__file__).resolve().parents[2]
KEY = "k1-secret"


@pytest.fixture(autouse=True)
def _no_key_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAEL_API_KEY", raising=False)


def _sample(f: dataclasses.Field[Any], declared: Setting) -> Any:
    """A value of the setting that is not its default, and that its rule accepts."""
    rule = declared.rule
    if isinstance(rule, Switch):
        return not f.default
    if isinstance(rule, Choice):
        return next(c for c in reversed(rule.choices) if c != f.default)
    if isinstance(rule, Integer):
        return rule.minimum + 3
    if isinstance(rule, Number):
        return 2.5
    if isinstance(rule, PortRule):
        return 9
    if isinstance(rule, TimeoutRule):
        return 60.0
    if isinstance(rule, Text):
        return f"x-{f.name}"
    if isinstance(rule, Names):
        return (f"x-{f.name}", "alias")
    if f.name == "api_keys":
        return ApiKeys([KEY])
    raise AssertionError(f"no sample value for the setting {f.name} ({type(rule).__name__}): add one here")


def _argv(f: dataclasses.Field[Any], declared: Setting, value: Any) -> list[str]:
    """The flags that set ``value``."""
    first = declared.flags[0]
    if first.action == "store_true":
        return [first.name]  # a switch flips its default
    if isinstance(value, ApiKeys):
        return [first.name, KEY]
    if isinstance(value, tuple):  # a repeatable flag, once per name
        return [arg for name in value for arg in (first.name, name)]
    return [first.name, str(value)]


def _samples(cls: type[Any], names: set[str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Every flag-backed setting of ``cls`` at a non-default value, and the argv that sets them all."""
    values, argv = {}, []
    for f, declared in settings_of(cls, names):
        if declared.flags:
            values[f.name] = _sample(f, declared)
            argv += _argv(f, declared, values[f.name])
    return values, argv


def _same(config: Any, values: dict[str, Any]) -> None:
    for name, value in values.items():
        got = getattr(config, name)
        if isinstance(value, ApiKeys):
            assert len(got) == 1 and got.accepts(KEY.encode()) and not got.accepts(b"other"), name
        else:
            assert got == value and type(got) is type(value), (name, got, value)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _declared_flags(cls: type[Any], names: set[str] | None = None) -> set[str]:
    return {flag.name for _, declared in settings_of(cls, names) for flag in declared.flags}


SERVER = [f.name for f, _ in settings_of(ServerConfig)]
RAY_OWN = {f.name for f, _ in settings_of(RayServeConfig)} - set(SERVER)


# ---- the parsers ---------------------------------------------------------------------------------


def test_the_kael_server_parser_is_exactly_the_declared_flags() -> None:
    assert _options(build_parser()) == _declared_flags(ServerConfig) | {"-h", "--help", "--version"}
    assert ServerConfig.from_args(build_parser().parse_args([])) == ServerConfig()  # the same defaults


@pytest.mark.parametrize("name", SERVER)
def test_each_setting_parses_back_from_its_flags(name: str) -> None:
    values, argv = _samples(ServerConfig, {name})
    if not values:
        pytest.skip(f"{name} is set in Python only")
    config = ServerConfig.from_args(build_parser().parse_args(argv))
    _same(config, values)
    assert dataclasses.replace(config, **values) == config  # and nothing else moved


def test_every_setting_at_once_from_kael_server_and_from_the_ray_command() -> None:
    values, argv = _samples(ServerConfig)
    assert set(values) == set(SERVER)  # every kael-server setting has a flag
    alone = ServerConfig.from_args(build_parser().parse_args(argv))
    _same(alone, values)
    ray_values, ray_argv = _samples(RayServeConfig, RAY_OWN)
    replica = RayServeConfig.from_args(ray_build_parser().parse_args(argv + ray_argv))
    _same(replica, values | ray_values)
    assert replica.server() == alone and type(replica.server()) is ServerConfig


def test_the_ray_parser_is_kael_servers_plus_the_declared_ray_flags() -> None:
    expected = _declared_flags(ServerConfig) | _declared_flags(RayServeConfig) | _declared_flags(RayCluster)
    assert _options(ray_build_parser()) == expected | {"-h", "--help", "--version"}
    assert RayServeConfig.from_args(ray_build_parser().parse_args([])) == RayServeConfig()
    cluster = RayCluster.from_args(ray_build_parser().parse_args(["--address", "auto", "--num-cpus-cluster", "2"]))
    assert cluster == RayCluster(address="auto", num_cpus_cluster=2) and cluster.name == "kael"


# ---- load_app and the replicas -------------------------------------------------------------------


@pytest.mark.parametrize("name", SERVER)
def test_load_app_takes_each_setting_as_a_keyword(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``load_app(**{name: value})`` builds the ServerConfig(name=value) that ``load_app(config)`` gets, and
    hands it whole to the model loader (create_app gets the config's keys, metrics guard and deadline)."""
    import kael_server.loading as loading

    (f, declared) = next(settings_of(ServerConfig, {name}))
    value = _sample(f, declared)
    made: list[dict[str, Any]] = []

    def create_app(load: Any, config: ServerConfig, **kwargs: Any) -> Any:
        made.append({"load": load, "config": config, **kwargs})
        return None

    monkeypatch.setattr(loading, "checkpoint_dir", lambda data: Path(data or "bundled"))
    monkeypatch.setattr(loading, "check_device", lambda device: None)
    monkeypatch.setattr(loading, "check_speculation", lambda config, path: None)  # settings alone, no models
    monkeypatch.setattr(loading, "create_app", create_app)
    config = ServerConfig(**{name: value})
    load_app(**{name: value})
    load_app(config)
    for app in made:
        loader = app["load"]
        assert isinstance(loader, loading.CheckpointLoader) and loader.config == config
        assert str(loader.path) == (value if name == "data" else "bundled")
        assert app["config"] is loader.config  # create_app derives its keys, metrics guard and deadline from it
    _same(made[0]["load"].config, {name: value})


def test_load_app_refuses_an_unknown_or_doubled_setting() -> None:
    with pytest.raises(ServerConfigError, match=r"^load_app: no setting named \['slot'\]; the settings are \["):
        load_app(None, slot=2)
    with pytest.raises(ServerConfigError, match=r"^load_app: pass \['device', 'slots'\] in the ServerConfig"):
        load_app(ServerConfig(), "cpu", slots=2)


def test_a_config_serves_what_it_says() -> None:
    """The bundled model under load_app(ServerConfig(...)): keys, the metrics guard and the deadline apply."""
    config = ServerConfig(api_keys=ApiKeys([KEY]), protect_metrics=True, request_timeout=30, slots=2, queue=1)
    app = load_app(config)
    assert app.state.server.request_timeout == 30.0
    with TestClient(app) as client:
        assert poll_until(lambda: client.get("/ready").status_code == 200, timeout=120)
        assert client.get("/metrics").status_code == 401  # protect_metrics with a key configured
        assert client.get("/health").status_code == 200
        auth = {"Authorization": f"Bearer {KEY}"}
        assert client.get("/metrics", headers=auth).status_code == 200


# ---- the docs page -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kael_docs_hooks_h2", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_page_lists_every_setting_with_its_flags_and_help(hooks: ModuleType) -> None:
    page = hooks.on_page_markdown((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"), None, None, None)
    server, rest = page.split("## `python -m kael_server.ray`")
    ray, _ = rest.split("## `python -m kael`")
    fields_in = {ServerConfig: set(SERVER), RayServeConfig: RAY_OWN, RayCluster: set()}  # the command's own
    for cls, section in ((ServerConfig, server), (RayServeConfig, ray), (RayCluster, ray)):
        for f, declared in settings_of(cls):
            for flag in declared.flags:  # the argparse table (the Ray command has kael-server's flags too)
                (row,) = [line for line in section.splitlines() if line.startswith(f"| `{flag.name}` |")]
                assert " ".join(flag.help.split())[:40].replace("<", "&lt;").replace(">", "&gt;") in row
            # the table of Python fields: kael-server's under it, RayServeConfig's own under Ray's
            assert (f"| `{f.name}` | " in section) == (f.name in fields_in[cls]), f.name


# ---- a new setting reaches everything ------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Extended(ServerConfig):
    beams: int = setting(1, Flag("--beams", "beams searched per request", metavar="B"), rule=Integer(1))


def test_a_setting_added_to_the_declaration_reaches_parser_checks_and_docs(hooks: ModuleType) -> None:
    parser = argparse.ArgumentParser(prog="demo", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(parser, _Extended)
    config = _Extended.from_args(parser.parse_args(["--beams", "3", "--slots", "2"]))
    assert (config.beams, config.slots, _Extended.from_args(parser.parse_args([])).beams) == (3, 2, 1)
    assert "beams searched per request (default: 1)" in " ".join(parser.format_help().split())
    with pytest.raises(ServerConfigError, match=r"^--beams must be an integer >= 1, got 0$"):
        _Extended(beams=0)
    assert "| `--beams` | `B` | `1` | beams searched per request |" in hooks.cli_markdown(parser)
    assert "| `beams` | `--beams` | `1` |" in settings_markdown(_Extended)
    assert config.server() == ServerConfig(slots=2)  # what load_app and a replica get: kael-server's own


# ---- refusals name the flag ----------------------------------------------------------------------


def _bad_values(declared: Setting, default: Any) -> list[Any]:
    rule = declared.rule
    if isinstance(rule, Integer):
        return [rule.minimum - 1, True, 1.5, "3"]
    if isinstance(rule, Number):
        return [math.nan, math.inf, -1.0, "2"] + ([] if rule.maximum is None else [rule.maximum + 1])
    if isinstance(rule, Choice):
        return ["nope", None if default is not None else 3]
    if isinstance(rule, Switch):
        return ["yes", 1, None]
    if isinstance(rule, Text):
        return [3, b"bytes"]
    if isinstance(rule, Names):
        return ["one name", [""], [" padded"], [3]]
    if isinstance(rule, PortRule):
        return [0, 65536, True, 80.0]
    if isinstance(rule, TimeoutRule):
        return [0, -5, math.nan, 86401, "10"]
    return ["one key", [""], ["has space"]]  # API keys


CASES = [
    pytest.param(cls, f.name, bad, id=f"{f.name}={bad!r}")
    for cls in (ServerConfig, RayServeConfig)
    for f, declared in settings_of(cls, None if cls is ServerConfig else RAY_OWN)
    for bad in _bad_values(declared, f.default)
]


@pytest.mark.parametrize(("cls", "name", "bad"), CASES)
def test_a_bad_value_is_refused_naming_its_flag(cls: type[ServerConfig], name: str, bad: Any) -> None:
    (_, declared) = next(settings_of(cls, {name}))
    flag = declared.flags[0].name if declared.flags else "--" + name.replace("_", "-")
    with pytest.raises(ServerConfigError) as refused:
        cls(**{name: bad})
    assert str(refused.value).startswith(flag), str(refused.value)
    assert "has space" not in str(refused.value)  # a key is never repeated


@given(minimum=st.integers(-3, 3), value=st.integers(-10, 10))
def test_a_strict_integer_flag_and_its_check_agree(minimum: int, value: int) -> None:
    rule = Integer(minimum)
    parse = rule.argparse_type()
    if value >= minimum:
        assert parse(str(value)) == value and rule.check("--n", value) == value
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=f"must be at least {minimum}, got {value}"):
            parse(str(value))
        with pytest.raises(ServerConfigError, match=f"^--n must be an integer >= {minimum}, got {value}$"):
            rule.check("--n", value)


@given(value=st.floats(allow_nan=True, allow_infinity=True) | st.floats(-1, 4000))
def test_a_seconds_flag_and_its_check_agree(value: float) -> None:
    rule = Number(0, 3600)
    inside = 0 <= value <= 3600  # False for nan
    parse = rule.argparse_type()
    if inside:
        assert parse(repr(value)) == value and rule.check("--s", value) == value
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="must be between 0 and 3600 seconds"):
            parse(repr(value))
        with pytest.raises(ServerConfigError, match="^--s must be between 0 and 3600 seconds"):
            rule.check("--s", value)


def _refusal(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "kael_server.cli", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    return done.stderr


def test_the_command_refuses_as_before() -> None:
    """argparse refuses a malformed value with its usage; a checked one is one ``kael-server:`` line; both exit 2."""
    assert "kael-server: error: argument --slots: must be at least 1, got 0" in _refusal("--slots", "0")
    line = "kael-server: --request-timeout: the request timeout must be more than 0 and at most 86400 s, got 0.0"
    assert line in _refusal("--request-timeout", "0").splitlines()
