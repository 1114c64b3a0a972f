"""Declared settings: a dataclass field that carries its command-line flags and its check.

A configuration class (``ServerConfig``, the Ray deployment's ``RayServeConfig``) declares each
setting once, as ``name: type = setting(default, Flag(...), rule=...)``. Everything else is
derived from that declaration: the argparse arguments (:func:`add_arguments`), the values read
back from parsed flags (:func:`values_from_args`), the checks a config runs when it is built
(:func:`check_settings`, which names the flag in every error), and the docs' table of flags.

A :class:`Rule` says how a flag's text becomes a value (argparse's ``type``; a strict rule refuses
out-of-range values while parsing, as argparse's own usage error) and how a value given in Python
is checked (ServerConfigError naming the flag, the value and what was expected).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from kael_server.errors import ServerConfigError

__all__ = [
    "Choice",
    "Flag",
    "Integer",
    "Names",
    "Number",
    "Rule",
    "Setting",
    "Switch",
    "Text",
    "add_arguments",
    "build_from_args",
    "check_settings",
    "flag_of",
    "setting",
    "settings_of",
    "values_from_args",
]

_KEY = "kael_setting"
_T = TypeVar("_T")


@dataclass(frozen=True)
class Flag:
    """One command-line argument of a setting: its option string and what ``--help`` says.

    ``action`` is argparse's (``store_true``, ``append``; None: the flag takes a value), ``dest``
    the namespace attribute when it is not the field's name (a setting read from several flags,
    or from a negated switch such as ``--no-prefix-cache``).
    """

    name: str
    help: str
    metavar: str | None = None
    action: str | None = None
    dest: str | None = None


class Rule:
    """How a setting's flag text is parsed and its value checked (subclasses below); ``choices``:
    the only values a flag takes (argparse's ``choices``), when there is such a list."""

    choices: tuple[str, ...] | None = None

    def argparse_type(self) -> Callable[[str], Any] | None:
        """argparse's ``type`` for the flag's text (None: the text itself); it raises
        argparse.ArgumentTypeError (or ValueError) for text it refuses."""
        return None

    def check(self, flag: str, value: Any) -> Any:
        """``value`` as stored (possibly normalised); ServerConfigError naming ``flag`` if it is refused."""
        return value


@dataclass(frozen=True)
class Text(Rule):
    """A string; ``path`` also takes an ``os.PathLike`` (stored as its string)."""

    path: bool = False

    def check(self, flag: str, value: Any) -> Any:
        if self.path and isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str):
            raise ServerConfigError(f"{flag} must be a string, got {value!r}")
        return value


@dataclass(frozen=True)
class Names(Rule):
    """Names given by a repeatable flag (each non-empty, without surrounding spaces), stored as a tuple."""

    def check(self, flag: str, value: Any) -> Any:
        if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
            raise ServerConfigError(f"{flag} must be a list of names, got {value!r}")
        for name in value:
            if not isinstance(name, str) or not name or name != name.strip():
                raise ServerConfigError(f"{flag} must be non-empty names without surrounding spaces, got {name!r}")
        return tuple(dict.fromkeys(value))


@dataclass(frozen=True)
class Switch(Rule):
    """True or False (a flag without a value)."""

    def check(self, flag: str, value: Any) -> Any:
        if not isinstance(value, bool):
            raise ServerConfigError(f"{flag} must be True or False, got {value!r}")
        return value


@dataclass(frozen=True)
class Choice(Rule):
    """One of ``values`` (argparse's ``choices``)."""

    choices: tuple[str, ...] = ()

    def check(self, flag: str, value: Any) -> Any:
        if value not in self.choices:
            raise ServerConfigError(f"{flag} must be one of {list(self.choices)}, got {value!r}")
        return value


@dataclass(frozen=True)
class Integer(Rule):
    """An integer of at least ``minimum``; ``strict``: a smaller one is refused while parsing too."""

    minimum: int = 0
    strict: bool = True

    def argparse_type(self) -> Callable[[str], Any]:
        return self._parse if self.strict else int  # int: argparse says "invalid int value" itself

    def _parse(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < self.minimum:
            raise argparse.ArgumentTypeError(f"must be at least {self.minimum}, got {value}")
        return value

    def check(self, flag: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
            raise ServerConfigError(f"{flag} must be an integer >= {self.minimum}, got {value!r}")
        return value


@dataclass(frozen=True)
class Number(Rule):
    """A finite number: with ``maximum``, from ``minimum`` to ``maximum`` seconds (both parsed and
    checked); without, more than ``minimum`` (checked only; argparse parses any float)."""

    minimum: float = 0.0
    maximum: float | None = None

    def argparse_type(self) -> Callable[[str], Any]:
        return float if self.maximum is None else self._parse

    def _parse(self, text: str) -> float:
        assert self.maximum is not None
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
        if not self.minimum <= value <= self.maximum:  # also refuses nan and inf
            raise argparse.ArgumentTypeError(
                f"must be between {self.minimum:g} and {self.maximum:g} seconds, got {text}"
            )
        return value

    def check(self, flag: str, value: Any) -> Any:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if self.maximum is None:
            if not (number and self.minimum < value < math.inf):
                raise ServerConfigError(f"{flag} must be a positive number, got {value!r}")
        elif not (number and self.minimum <= value <= self.maximum):
            raise ServerConfigError(
                f"{flag} must be between {self.minimum:g} and {self.maximum:g} seconds, got {value!r}"
            )
        return value


@dataclass(frozen=True)
class Setting:
    """What a configuration field declares besides its type and default (see :func:`setting`)."""

    flags: tuple[Flag, ...]
    rule: Rule
    optional: bool = False
    from_args: Callable[[argparse.Namespace], Any] | None = None


def setting(
    default: Any = dataclasses.MISSING,
    *flags: Flag,
    rule: Rule,
    optional: bool = False,
    from_args: Callable[[argparse.Namespace], Any] | None = None,
    default_factory: Callable[[], Any] | None = None,
    repr: bool = True,
    compare: bool = True,
) -> Any:
    """A dataclass field declared with its command-line ``flags`` and ``rule``.

    ``optional``: None is a value too (no limit, as stored, ...), never checked by the rule.
    ``from_args`` builds the value from the parsed flags when it is not simply the field's own
    namespace attribute (a negated switch, keys read from several flags). No flags: a setting
    made in Python only (it keeps its default on the command line). ``repr`` and ``compare`` are
    dataclasses.field's.
    """
    meta = {_KEY: Setting(tuple(flags), rule, optional, from_args)}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta, repr=repr, compare=compare)
    return dataclasses.field(default=default, metadata=meta, repr=repr, compare=compare)


def settings_of(cls: Any, names: Iterable[str] | None = None) -> Iterator[tuple[dataclasses.Field[Any], Setting]]:
    """Each declared setting of the dataclass ``cls`` (or instance), in declaration order (only ``names``)."""
    wanted = None if names is None else set(names)
    for f in dataclasses.fields(cls):
        declared = f.metadata.get(_KEY)
        if isinstance(declared, Setting) and (wanted is None or f.name in wanted):
            yield f, declared


def flag_of(declared: Setting, name: str) -> str:
    """The flag that names the setting ``name`` in errors: its first, or ``--name-like-this`` for a
    setting made in Python only."""
    return declared.flags[0].name if declared.flags else "--" + name.replace("_", "-")


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def add_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: Any, names: Iterable[str] | None = None
) -> None:
    """Adds every flag of ``cls``'s settings (only ``names``) to ``parser``, with its help, metavar,
    choices, argparse type and the field's default."""
    for f, declared in settings_of(cls, names):
        for flag in declared.flags:
            kwargs: dict[str, Any] = {"help": flag.help, "dest": flag.dest or f.name}
            if flag.action == "store_true":
                kwargs.update(action="store_true")
            elif flag.action == "append":
                kwargs.update(action="append", default=[], metavar=flag.metavar)
            else:  # a flag of its own name takes the field's default; another one (a key file) None
                own = flag.dest in (None, f.name)
                kwargs.update(default=_default(f) if own else None, metavar=flag.metavar)
                if declared.rule.choices is not None:
                    kwargs["choices"] = declared.rule.choices
                else:
                    kwargs["type"] = declared.rule.argparse_type()
            parser.add_argument(flag.name, **{k: v for k, v in kwargs.items() if v is not None or k == "default"})


def values_from_args(cls: Any, args: argparse.Namespace, names: Iterable[str] | None = None) -> dict[str, Any]:
    """The values of ``cls``'s settings (only ``names``) in parsed flags, each checked in declaration
    order as it is read (the first bad one raises ServerConfigError naming its flag)."""
    values = {}
    for f, declared in settings_of(cls, names):
        if not declared.flags:
            continue  # a Python-only setting keeps its default
        value = declared.from_args(args) if declared.from_args is not None else getattr(args, f.name)
        values[f.name] = _checked(declared, f.name, value)
    return values


def _checked(declared: Setting, name: str, value: Any) -> Any:
    if value is None and declared.optional:
        return None
    return declared.rule.check(flag_of(declared, name), value)


def check_settings(config: Any) -> None:
    """Checks every setting of the (frozen) dataclass instance ``config`` and stores its normalised
    value; ServerConfigError naming the flag of the first bad one."""
    for f, declared in settings_of(config):
        value = getattr(config, f.name)
        checked = _checked(declared, f.name, value)
        if checked is not value:
            object.__setattr__(config, f.name, checked)


def build_from_args(cls: Callable[..., _T], args: argparse.Namespace, **values: Any) -> _T:
    """An instance of the settings dataclass ``cls`` from parsed flags (:func:`values_from_args`),
    plus ``values`` for settings not read from flags."""
    return cls(**values_from_args(cls, args), **values)
