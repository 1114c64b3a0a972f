"""The chat templates kael's model families ship with render as transformers renders them (#31).

The templates in ``tests/data/chat_templates/`` are the model repos' own (verbatim from
llama.cpp's ``models/templates``, Gemma 3's and OLMo 2's from other copies: see the README there). Each is saved with a tiny
``PreTrainedTokenizerFast`` carrying the family's special tokens; kael loads the template
from that directory (``ChatTemplate.from_directory``) and must render every conversation to
exactly the text ``apply_chat_template(messages, tokenize=False, ...)`` gives: plain turns,
system prompts, generation prompt on and off, and where the template has them tools, tool
calls and tool answers, thinking switches, documents and Llama's date. Conversations a
template refuses (``raise_exception``) must be a ``ChatTemplateError`` with the template's
message where transformers raises. ``strftime_now`` is frozen to one date in both.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from kael import ChatTemplateError  # noqa: E402
from kael.tokenizer import ChatTemplate  # noqa: E402

TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "chat_templates"


@dataclass(frozen=True)
class Family:
    """A template file, the special tokens its tokenizer config names, and what the template supports."""

    file: str
    bos: str | None
    eos: str
    features: frozenset[str] = frozenset()


FAMILIES = {
    "qwen3": Family("Qwen-Qwen3-0.6B.jinja", None, "<|im_end|>", frozenset({"tools", "parallel", "thinking"})),
    "qwen2": Family("Qwen-Qwen2.5-7B-Instruct.jinja", None, "<|im_end|>", frozenset({"tools", "parallel"})),
    "gemma": Family("google-gemma-2-2b-it.jinja", "<bos>", "<eos>", frozenset({"no_system"})),
    "gemma3": Family("google-gemma-3-270m-it.jinja", "<bos>", "<eos>"),
    "olmo2": Family("allenai-OLMo-2-1124-13B-Instruct.jinja", "<|endoftext|>", "<|endoftext|>"),
    "phi3": Family("microsoft-Phi-3.5-mini-instruct.jinja", "<s>", "<|endoftext|>"),
    "granite": Family(
        "ibm-granite-granite-3.3-2B-Instruct.jinja", "<|end_of_text|>", "<|end_of_text|>", frozenset({"tools", "docs"})
    ),
    "smollm3": Family("HuggingFaceTB-SmolLM3-3B.jinja", None, "<|im_end|>", frozenset({"tools", "smol_thinking"})),
    "llama3.1": Family(
        "meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", frozenset({"tools", "llama"})
    ),
    "llama3.2": Family(
        "meta-llama-Llama-3.2-3B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", frozenset({"tools", "llama"})
    ),
    "mistral": Family(
        "mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>", frozenset({"tools", "parallel", "mistral"})
    ),
}

FROZEN_NOW = datetime(2031, 3, 7, 12, 30)


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _assistant(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


def _system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def _call(name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool(text: str, call_id: str) -> dict[str, Any]:
    return {"role": "tool", "content": text, "tool_call_id": call_id}


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": 'The current weather in a city <with> & "quotes".',
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Zürich"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    },
]

WEATHER = _call("get_weather", {"city": "Zürich", "unit": "celsius"}, "call00001")
ADD = _call("add", {"a": 2, "b": 40}, "call00002")

# name -> (messages, template kwargs, the feature the template needs, or "" for every template)
CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], dict[str, Any], str]] = {
    "single_user": ([_user("Hello!")], {}, ""),
    "system_user": ([_system("Be brief."), _user("What is 2+2?")], {}, "system"),
    "multi_turn": (
        [_user("  Hi  there \n"), _assistant("Hello! How can I help? 🙂"), _user('A joke with <tags> & "quotes".')],
        {},
        "",
    ),
    "system_multi_turn": (
        [_system("You are a pirate."), _user("Ahoy"), _assistant("Arr!"), _user("中文 and émoji"), _assistant("¡Sí!")],
        {},
        "system",
    ),
    "empty_system": ([_system(""), _user("Hi")], {}, "system"),
    "long_alternating": (
        [_user("a "), _assistant(" b"), _user("\tc\n"), _assistant("d\n\n"), _user("e"), _assistant("f"), _user("g")],
        {},
        "",
    ),
    "tools_offered": ([_system("Use tools when useful."), _user("Weather in Zürich?")], {"tools": TOOLS}, "tools"),
    "tools_no_system": ([_user("What is 2 + 40?")], {"tools": TOOLS}, "tools"),
    "tool_round_trip": (
        [
            _user("Weather in Zürich?"),
            _assistant("", tool_calls=[WEATHER]),
            _tool('{"temperature": 21, "sky": "clear"}', "call00001"),
            _assistant("It is 21 °C and clear."),
            _user("Thanks!"),
        ],
        {"tools": TOOLS},
        "tools",
    ),
    "tool_call_last": (
        [_user("Weather in Zürich?"), _assistant("", tool_calls=[WEATHER]), _tool("21 degrees", "call00001")],
        {"tools": TOOLS},
        "tools",
    ),
    "parallel_tool_calls": (
        [
            _user("Weather in Zürich, and 2 + 40?"),
            _assistant("Let me check both.", tool_calls=[WEATHER, ADD]),
            _tool("21 degrees", "call00001"),
            _tool("42", "call00002"),
        ],
        {"tools": TOOLS},
        "parallel",
    ),
    "qwen3_thinking_off": ([_user("Quick: 2+2?")], {"enable_thinking": False}, "thinking"),
    "qwen3_thinking_on": ([_user("Think: 2+2?")], {"enable_thinking": True}, "thinking"),
    "qwen3_think_in_history": (
        [
            _user("2+2?"),
            _assistant("<think>\nTwo and two.\n</think>\n\n4"),
            _user("And 3+3?"),
            _assistant("<think>\nThree and three.\n</think>\n\n6"),
        ],
        {},
        "thinking",
    ),
    "qwen3_reasoning_content": (
        [_user("2+2?"), _assistant("4", reasoning_content="Two and two make four.")],
        {},
        "thinking",
    ),
    "qwen3_multi_step_tools": (
        [
            _user("Weather in Zürich?"),
            _assistant("<think>\nI should call the tool.\n</think>\n\n", tool_calls=[WEATHER]),
            _tool("21 degrees", "call00001"),
            _assistant("<think>\nIt answered.\n</think>\n\nIt is 21 °C."),
        ],
        {"tools": TOOLS},
        "thinking",
    ),
    "qwen3_reasoning_alias": ([_user("2+2?"), _assistant("4", reasoning="Two and two.")], {}, "thinking"),
    "qwen3_thinking_alias": ([_user("2+2?"), _assistant("4", thinking="Two and two.")], {}, "thinking"),
    "qwen3_reasoning_both": (
        [_user("2+2?"), _assistant("4", reasoning="ignored", reasoning_content="Two and two.")],
        {},
        "thinking",
    ),
    "qwen3_string_arguments": (
        [
            _user("2 + 40?"),
            _assistant("", tool_calls=[_call("add", '{"a": 2, "b": 40}', "call00002")]),
            _tool("42", "call00002"),
        ],
        {"tools": TOOLS},
        "thinking",
    ),
    "smollm3_thinking_off": ([_user("Quick: 2+2?"), _assistant("4")], {"enable_thinking": False}, "smol_thinking"),
    "smollm3_no_think_system": (
        [_system("Answer tersely. /no_think"), _user("2+2?"), _assistant("\n4")],
        {},
        "smol_thinking",
    ),
    "smollm3_think_system": ([_system("/think"), _user("2+2?")], {"enable_thinking": False}, "smol_thinking"),
    "granite_documents": (
        [_user("What colour is the sky?")],
        {"documents": [{"doc_id": 1, "text": "The sky is blue."}, {"doc_id": "b", "text": "Grass is green."}]},
        "docs",
    ),
    "granite_documents_controls": (
        [_user("What colour is the sky?")],
        {"documents": [{"doc_id": 1, "text": "The sky is blue."}], "controls": {"citations": True, "length": "short"}},
        "docs",
    ),
    "granite_thinking": ([_user("Why is the sky blue?")], {"thinking": True}, "docs"),
    "granite_tools_and_documents": (
        [_user("Weather?")],
        {"tools": TOOLS, "documents": [{"doc_id": 7, "text": "Zürich is in Switzerland."}]},
        "docs",
    ),
    "llama_date_string": ([_system("Be brief."), _user("Hi")], {"date_string": "26 Jul 2024"}, "llama"),
    "llama_tools_in_system": (
        [_user("Weather in Zürich?")],
        {"tools": TOOLS, "tools_in_user_message": False, "date_string": "1 Jan 2025"},
        "llama",
    ),
    "llama_custom_tools": ([_system("Tools ready."), _user("2 + 40?")], {"custom_tools": TOOLS[1:]}, "llama"),
    "mistral_system_last_user": (
        [_system("Be brief."), _user("Hi"), _assistant("Hello"), _user("Bye")],
        {"tools": TOOLS},
        "mistral",
    ),
}

# name -> (template, messages, template kwargs, the message transformers and kael raise with)
REFUSED: dict[str, tuple[str, list[dict[str, Any]], dict[str, Any], str]] = {
    "gemma_system": ("gemma", [_system("Be brief."), _user("Hi")], {}, "System role not supported"),
    "gemma_two_users": ("gemma", [_user("Hi"), _user("Hello?")], {}, "Conversation roles must alternate"),
    "gemma_starts_with_assistant": ("gemma", [_assistant("Hi"), _user("Hello")], {}, "roles must alternate"),
    "gemma3_two_users": ("gemma3", [_system("s"), _user("Hi"), _user("Hello?")], {}, "roles must alternate"),
    "gemma3_system_then_assistant": ("gemma3", [_system("s"), _assistant("Hi")], {}, "roles must alternate"),
    "mistral_two_users": ("mistral", [_system("s"), _user("a"), _user("b")], {}, "roles must alternate"),
    "mistral_bad_call_id": (
        "mistral",
        [_user("Weather?"), _assistant("", tool_calls=[_call("get_weather", {"city": "Bern"}, "c1")])],
        {"tools": TOOLS},
        "Tool call IDs should be alphanumeric strings with length 9!",
    ),
    "llama3.2_parallel_calls": (
        "llama3.2",
        [_user("Both?"), _assistant("", tool_calls=[WEATHER, ADD])],
        {"tools": TOOLS},
        "This model only supports single tool-calls at once!",
    ),
    "llama3.1_tools_without_user": (
        "llama3.1",
        [_system("Only a system message.")],
        {"tools": TOOLS},
        "Cannot put tools in the first user message when there's no first user message!",
    ),
}

# Llama 3.1's builtin tools (ipython mode, <|python_tag|> calls) are its own conversations.
BUILTIN = {
    "llama3.1_builtin_tools": (
        [_system("Search when unsure."), _user("Who won?")],
        {"builtin_tools": ["brave_search", "wolfram_alpha"], "tools": TOOLS},
    ),
    "llama3.1_builtin_call": (
        [
            _user("Who won?"),
            _assistant("", tool_calls=[_call("brave_search", {"query": "who won"}, "call00003")]),
            _tool("Team A won.", "call00003"),
        ],
        {"builtin_tools": ["brave_search", "code_interpreter"]},
    ),
}


def _supports(family: Family, feature: str) -> bool:
    if feature == "":
        return True
    if feature == "system":
        return "no_system" not in family.features
    return feature in family.features


CASES = [
    pytest.param(family, conversation, add, id=f"{family}-{conversation}-{'gen' if add else 'nogen'}")
    for family, spec in FAMILIES.items()
    for conversation, (_, _, feature) in CONVERSATIONS.items()
    if _supports(spec, feature)
    for add in (True, False)
]


@pytest.fixture(autouse=True)
def frozen_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """``strftime_now`` reads one fixed time in kael and in transformers (Granite and Llama 3.2 print the date)."""
    import kael.tokenizer._chat as kael_chat
    import transformers.utils.chat_template_utils as hf_chat

    class Frozen(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Frozen:
            return cls.fromtimestamp(FROZEN_NOW.timestamp(), tz)

    monkeypatch.setattr(hf_chat, "datetime", Frozen)
    monkeypatch.setattr(kael_chat, "datetime", Frozen)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, ChatTemplate]]:
    """Per family: a transformers tokenizer with the template and its tokens, and kael's template read from its files."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("family_chat")
    out: dict[str, tuple[Any, ChatTemplate]] = {}
    for name, family in FAMILIES.items():
        source = (TEMPLATES / family.file).read_text(encoding="utf-8")
        vocab = {"<unk>": 0, family.eos: 1}
        if family.bos is not None:
            vocab.setdefault(family.bos, 2)
        tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tk.pre_tokenizer = pre_tokenizers.Whitespace()
        hf = PreTrainedTokenizerFast(
            tokenizer_object=tk, bos_token=family.bos, eos_token=family.eos, unk_token="<unk>", chat_template=source
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf.save_pretrained(root / name)
        template = ChatTemplate.from_directory(root / name)
        assert template is not None and template.source == source
        assert (template.bos_token, template.eos_token) == (family.bos, family.eos)
        out[name] = (hf, template)
    return out


def _hf_render(hf: Any, messages: list[dict[str, Any]], add: bool, kwargs: dict[str, Any]) -> str:
    return str(hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add, **kwargs))


@pytest.mark.parametrize(("family", "conversation", "add"), CASES)
def test_family_template_matches_transformers(
    saved: dict[str, tuple[Any, ChatTemplate]], family: str, conversation: str, add: bool
) -> None:
    hf, template = saved[family]
    messages, kwargs, _ = CONVERSATIONS[conversation]
    expected = _hf_render(hf, messages, add, kwargs)
    assert template.render(messages, add_generation_prompt=add, **kwargs) == expected
    assert expected  # a real comparison, not of two empty strings


@pytest.mark.parametrize("case", list(BUILTIN))
@pytest.mark.parametrize("add", [True, False])
def test_llama31_builtin_tools_match_transformers(
    saved: dict[str, tuple[Any, ChatTemplate]], case: str, add: bool
) -> None:
    hf, template = saved["llama3.1"]
    messages, kwargs = BUILTIN[case]
    expected = _hf_render(hf, messages, add, kwargs)
    assert template.render(messages, add_generation_prompt=add, **kwargs) == expected
    assert "Environment: ipython\nTools: brave_search" in expected


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_conversations_raise_in_both(saved: dict[str, tuple[Any, ChatTemplate]], case: str) -> None:
    import jinja2

    family, messages, kwargs, message = REFUSED[case]
    hf, template = saved[family]
    with pytest.raises(jinja2.exceptions.TemplateError, match=message):
        _hf_render(hf, messages, True, kwargs)
    with pytest.raises(ChatTemplateError, match=r"refused the messages: .*" + message) as info:
        template.render(messages, add_generation_prompt=True, **kwargs)
    assert str(info.value).startswith(template.name)


def test_conversations_reach_the_features(saved: dict[str, tuple[Any, ChatTemplate]]) -> None:
    """The feature conversations render what they are meant to test (not a branch that ignores them)."""
    _, qwen3 = saved["qwen3"]
    messages, kwargs, _ = CONVERSATIONS["tool_round_trip"]
    text = qwen3.render(messages, **kwargs)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}' in text
    assert (
        "<tool_response>\n" in text and '"description": "The current weather in a city <with> & \\"quotes\\"."' in text
    )
    assert qwen3.render([_user("x")], enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    messages = CONVERSATIONS["qwen3_reasoning_content"][0]
    assert "<think>\nTwo and two make four.\n</think>\n\n4" in qwen3.render(messages, add_generation_prompt=False)
    _, granite = saved["granite"]
    assert "Today's Date: March 07, 2031." in granite.render([_user("x")])  # strftime_now, frozen
    _, llama = saved["llama3.2"]
    assert "Today Date: 07 Mar 2031\n" in llama.render([_user("x")])
    assert llama.render([_user("x")]).startswith("<|begin_of_text|><|start_header_id|>system")
    _, mistral = saved["mistral"]
    messages, kwargs, _ = CONVERSATIONS["parallel_tool_calls"]
    text = mistral.render(messages, **kwargs)
    assert '[TOOL_CALLS][{"name": "get_weather"' in text and '"call_id": "call00002"}[/TOOL_RESULTS]' in text
    _, gemma = saved["gemma"]
    assert gemma.render([_user(" Hi ")]) == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    messages, kwargs, _ = CONVERSATIONS["qwen3_reasoning_alias"]
    assert "<think>\nTwo and two.\n</think>\n\n4<|im_end|>" in qwen3.render(messages, add_generation_prompt=False)
    _, gemma3 = saved["gemma3"]  # the system message folded into the first user turn
    messages = CONVERSATIONS["system_multi_turn"][0]
    assert gemma3.render(messages[:3], add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nYou are a pirate.\n\nAhoy<end_of_turn>\n<start_of_turn>model\nArr!<end_of_turn>\n"
    )
    _, olmo2 = saved["olmo2"]  # Tülu's turns: eos after each answer, a newline after all but the last message
    assert olmo2.render(messages[:3], add_generation_prompt=False) == (
        "<|endoftext|><|system|>\nYou are a pirate.\n<|user|>\nAhoy\n<|assistant|>\nArr!<|endoftext|>"
    )
    assert olmo2.render(messages[:2]).endswith("<|user|>\nAhoy\n<|assistant|>\n")


@pytest.mark.parametrize("family", ["gemma", "mistral", "llama3.2"])
def test_template_writing_bos_with_a_tokenizer_without_one(family: str) -> None:
    """A tokenizer config without ``bos_token`` leaves it undefined: ``{{ bos_token }}`` writes "" (not "None")."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    source = (TEMPLATES / FAMILIES[family].file).read_text(encoding="utf-8")
    eos = FAMILIES[family].eos
    tk = Tokenizer(models.WordLevel({"<unk>": 0, eos: 1}, unk_token="<unk>"))
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=eos, unk_token="<unk>", chat_template=source)
    messages = [_user("Hi"), _assistant("Hello"), _user("Bye")]
    expected = _hf_render(hf, messages, True, {})
    assert ChatTemplate(source, eos_token=eos).render(messages, add_generation_prompt=True) == expected
    assert "None" not in expected


def test_template_files_are_the_ones_the_readme_names() -> None:
    """Every template file is listed in the README with its sha256 (the files are data, kept verbatim)."""
    import hashlib

    readme = (TEMPLATES / "README.md").read_text(encoding="utf-8")
    files = sorted(path.name for path in TEMPLATES.glob("*.jinja"))
    assert files == sorted(family.file for family in FAMILIES.values())
    for name in files:
        digest = hashlib.sha256((TEMPLATES / name).read_bytes()).hexdigest()
        assert f"| `{name}` |" in readme and f"`{digest}` |" in readme, name
