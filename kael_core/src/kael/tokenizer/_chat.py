"""``ChatTemplate``: a Hugging Face chat template (Jinja), rendered as ``transformers`` renders it.

``transformers.apply_chat_template(messages, tokenize=False)`` renders the checkpoint's
template in jinja2's ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and
``lstrip_blocks``, the loop controls (``break``/``continue``), the ``generation`` block
tag, and the globals ``raise_exception``, ``strftime_now``, ``dict`` and ``namespace``
(which refuses underscore names), a ``tojson`` filter that does not escape HTML, and
the variables ``messages``, ``tools``, ``documents``, ``add_generation_prompt`` and the
special tokens. This module builds the same environment, so a template renders here to
the same text. Templates are untrusted code: the sandbox blocks access to Python
internals, and every failure is a ``kael.ChatTemplateError`` (at render) or a
``kael.FormatError`` (a template that does not compile) that names the template and
the line, never the whole template.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, Protocol

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kael._errors import ChatTemplateError, FormatError
from kael.tokenizer._hfconfig import TOKENIZER_CONFIG, read_json_object, read_tokenizer_config

__all__ = ["ChatTemplate", "ROLES", "SupportsSpecialTokens", "CHAT_TEMPLATE_JINJA"]

CHAT_TEMPLATE_JINJA = "chat_template.jinja"
_CHAT_TEMPLATE_JSON = "chat_template.json"

ROLES = ("system", "user", "assistant", "tool")
"""The message roles ``render`` accepts."""

_TURN_ENDERS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|end_of_turn|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
    "<|return|>",
)
"""Special tokens that end a turn in the common template families, when a template writes them."""

_MARK = "\x00kael-turn-end-probe\x00"

_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
"""The names a message's reasoning may come under, in the order transformers looks for it."""


class SupportsSpecialTokens(Protocol):
    """A tokenizer as ``end_of_turn_tokens`` uses it: its special tokens by text."""

    @property
    def special_tokens(self) -> dict[str, int]: ...


class _RaisedByTemplate(jinja2.exceptions.TemplateError):
    """What the template's ``raise_exception(message)`` raises (turned into a ChatTemplateError)."""


def _raise_exception(message: object) -> NoReturn:
    raise _RaisedByTemplate(str(message))


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Jinja's own tojson escapes HTML characters; transformers' (and so the templates') does not.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """``dict(...)`` for templates, without exposing the ``dict`` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses underscore-prefixed attribute names (no reaching into internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature trick: `self` may be a key
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_', got {name!r}")


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text; rendering keeps just the body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return str(caller())


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


_ENV = _environment()


class ChatTemplate:
    """A Hugging Face chat template: ``render(messages)`` gives the prompt text a chat model expects.

    >>> template = ChatTemplate("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\\n{% endfor %}")
    >>> template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    '<|user|>Hi\\n'

    ``bos_token`` and ``eos_token`` are the texts the template sees under those names
    (None: the name stays undefined, as transformers leaves a token the tokenizer lacks);
    ``name`` names the template (its file) in errors. A template that does not compile
    is a ``FormatError`` naming ``name`` and the line.
    """

    def __init__(
        self,
        source: str,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        name: str = "chat_template",
    ) -> None:
        if not isinstance(source, str):
            raise FormatError(f"{name}: a chat template must be a string, got {type(source).__name__}")
        self._source = source
        self._name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _ENV.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise FormatError(
                f"{name}, line {e.lineno}: the chat template does not compile: {_short(e.message)}"
            ) from None
        except (jinja2.exceptions.TemplateError, RecursionError) as e:
            raise FormatError(f"{name}: the chat template does not compile: {_short(str(e))}") from None

    @property
    def source(self) -> str:
        """The template's Jinja source."""
        return self._source

    @property
    def name(self) -> str:
        """What errors call this template (its file, or ``"chat_template"``)."""
        return self._name

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self._name!r}, chars={len(self._source)})"

    # -- loading --------------------------------------------------------------------

    @classmethod
    def from_directory(cls, directory: str | os.PathLike[str]) -> ChatTemplate | None:
        """The chat template of a checkpoint directory, or None when it has none.

        Looked for in ``chat_template.jinja``, then ``chat_template.json``, then the
        ``chat_template`` entry of ``tokenizer_config.json`` (a string, or a list of
        ``{"name", "template"}`` of which the one named ``"default"`` is used). The
        template sees ``tokenizer_config.json``'s ``bos_token`` and ``eos_token``.
        """
        root = Path(directory)
        config = read_tokenizer_config(root)
        bos = config.named.get("bos_token")
        eos = config.named.get("eos_token")
        tokens: dict[str, str | None] = {
            "bos_token": bos.content if bos else None,
            "eos_token": eos.content if eos else None,
        }
        jinja_path = root / CHAT_TEMPLATE_JINJA
        if jinja_path.is_file():
            try:
                text = jinja_path.read_bytes().decode("utf-8")
            except UnicodeDecodeError as e:
                raise FormatError(f"{jinja_path}: not valid UTF-8 at byte {e.start}: {e.reason}") from None
            except OSError as e:
                raise FormatError(f"{jinja_path}: cannot be read: {e.strerror or e}") from None
            return cls(text, name=str(jinja_path), **tokens)
        json_path = root / _CHAT_TEMPLATE_JSON
        if json_path.is_file():
            entry = read_json_object(json_path).get("chat_template")
            if entry is None:
                raise FormatError(f"{json_path}: expected a 'chat_template' entry")
            return cls.from_config_entry(entry, str(json_path), **tokens)
        return cls.from_config_entry(config.chat_template, str(root / TOKENIZER_CONFIG), **tokens)

    @classmethod
    def from_config_entry(
        cls, entry: object, source: str, *, bos_token: str | None = None, eos_token: str | None = None
    ) -> ChatTemplate | None:
        """A template from a config file's ``chat_template`` value (None when the value is None)."""
        if entry is None:
            return None
        if isinstance(entry, str):
            return cls(entry, bos_token=bos_token, eos_token=eos_token, name=f"{source} chat_template")
        if isinstance(entry, list):
            names: list[str] = []
            for index, item in enumerate(entry):
                if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                    raise FormatError(
                        f"{source}: chat_template[{index}] must be an object with a string 'name' and 'template'"
                    )
                names.append(item["name"])
                if item["name"] == "default":
                    template = item.get("template")
                    if not isinstance(template, str):
                        raise FormatError(f"{source}: chat_template[{index}] ('default') needs a string 'template'")
                    return cls(
                        template, bos_token=bos_token, eos_token=eos_token, name=f"{source} chat_template[default]"
                    )
            raise FormatError(f"{source}: chat_template lists no template named 'default' (it has {names[:10]})")
        raise FormatError(
            f"{source}: chat_template must be a string or a list of {{name, template}}, got {type(entry).__name__}"
        )

    # -- rendering ------------------------------------------------------------------

    def render(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """The prompt for ``messages``, as ``apply_chat_template(messages, tokenize=False)`` renders it.

        Each message has a ``role`` (``system``, ``user``, ``assistant`` or ``tool``: a tool's
        answer) and a string ``content``; other keys (``tool_calls``, ``tool_call_id``) pass
        through; reasoning given as ``reasoning_content``, ``thinking`` or ``reasoning`` reaches
        the template under the first two names. ``add_generation_prompt`` ends the prompt
        with the opening of an assistant turn. Further keyword arguments are template
        variables (they may override ``bos_token``/``eos_token``). Any failure, the
        template's own ``raise_exception(message)`` included, is a ``ChatTemplateError``.
        """
        chat = _check_messages(messages)
        variables = self._token_variables()
        variables.update(_plain(kwargs))
        variables.setdefault("tools", None)
        variables.setdefault("documents", None)
        return self._render(chat, bool(add_generation_prompt), variables)

    def _token_variables(self) -> dict[str, Any]:
        # NOTE: a token the tokenizer config does not name stays undefined, as in transformers (which
        # passes only the tokens it has): `{{ bos_token }}` then renders "", not "None".
        tokens = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        return {name: text for name, text in tokens.items() if text is not None}

    def _render(self, chat: list[dict[str, Any]], add_generation_prompt: bool, variables: dict[str, Any]) -> str:
        try:
            return self._template.render(messages=chat, add_generation_prompt=add_generation_prompt, **variables)
        except _RaisedByTemplate as e:
            raise ChatTemplateError(
                f"{self._name}: the chat template refused the messages: {_short(e.message)}"
            ) from None
        except jinja2.exceptions.SecurityError as e:
            raise ChatTemplateError(
                f"{self._name}{_line(e)}: the sandbox blocked an unsafe operation: {_short(str(e))}"
            ) from None
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"{self._name}{_line(e)}: rendering failed: {_short(str(e))}") from None
        except RecursionError:
            raise ChatTemplateError(f"{self._name}: rendering failed: recursion too deep") from None
        except Exception as e:
            raise ChatTemplateError(
                f"{self._name}{_line(e)}: rendering failed: {type(e).__name__}: {_short(str(e))}"
            ) from None

    # -- end of turn ----------------------------------------------------------------

    def end_of_turn_tokens(self, tokenizer: SupportsSpecialTokens) -> tuple[int, ...]:
        """The ids of the tokenizer's special tokens that end an assistant turn in this template.

        First the special token the template writes right after an assistant message
        (found by rendering a short conversation), then the usual turn enders
        (``<|im_end|>``, ``<|eot_id|>``, ``<|end|>``, ``<end_of_turn>``, ``</s>``, ...) that
        the template writes literally, then the template's ``eos_token``; each once.
        """
        special = tokenizer.special_tokens
        found: list[int] = []

        def add(text: str | None) -> None:
            if text is not None and text in special and special[text] not in found:
                found.append(special[text])

        add(self._token_after_assistant(special))
        for text in _TURN_ENDERS:
            if text in self._source:
                add(text)
        add(self.eos_token)
        return tuple(found)

    def _token_after_assistant(self, special: Mapping[str, int]) -> str | None:
        chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARK}]
        variables = self._token_variables()
        variables.update(tools=None, documents=None)
        try:
            text = self._render(chat, False, variables)
        except ChatTemplateError:
            return None
        at = text.rfind(_MARK)
        if at < 0:
            return None
        rest = text[at + len(_MARK) :].lstrip()
        for name in sorted(special, key=len, reverse=True):
            if name and rest.startswith(name):
                return name
        return None


def _check_messages(messages: object) -> list[dict[str, Any]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatTemplateError(f"messages must be a list of {{role, content}} objects, got {type(messages).__name__}")
    chat: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(
                f"messages[{index}] must be an object with 'role' and 'content', got {type(message).__name__}"
            )
        role = message.get("role")
        if role not in ROLES:
            got = "no role" if "role" not in message else f"role {_short(repr(role))}"
            raise ChatTemplateError(f"messages[{index}].role must be one of {list(ROLES)}, got {got}")
        if "content" not in message or message["content"] is None:
            raise ChatTemplateError(f"messages[{index}].content is missing: every message needs a string content")
        if not isinstance(message["content"], str):
            raise ChatTemplateError(
                f"messages[{index}].content must be a string, got {type(message['content']).__name__}"
            )
        # Plain JSON data only (no objects whose methods the sandbox does not know); None values dropped.
        entry = {str(k): _plain(v) for k, v in message.items() if v is not None}
        # NOTE: as transformers does, a message's reasoning under any of its names reaches the template
        # as `reasoning_content` (what most templates read) and, unless given, as `thinking` (gpt-oss).
        reasoning = next((entry[key] for key in _REASONING_KEYS if key in entry), None)
        if reasoning is not None:
            entry = {"thinking": reasoning, **entry, "reasoning_content": reasoning}
        chat.append(entry)
    return chat


def _plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types; anything else becomes a placeholder naming its type."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


def _line(e: BaseException) -> str:
    """``", line N"`` of the template frame the error came from, if any."""
    tb = e.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    lineno = getattr(e, "lineno", None)
    if line is None and isinstance(lineno, int):
        line = lineno
    return f", line {line}" if line is not None else ""


_SPACE = re.compile(r"\s+")


def _short(text: object, limit: int = 200) -> str:
    """One line of at most ``limit`` characters (never echo a whole template or input)."""
    one = _SPACE.sub(" ", str(text)).strip()
    return one if len(one) <= limit else one[: limit - 3] + "..."
