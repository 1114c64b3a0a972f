"""kael_server.tools: hand-written model outputs in each format (as the formats' documentation
shows them: Hermes/Qwen2.5 ``<tool_call>``, Llama 3.1 JSON with and without ``<|python_tag|>``,
Mistral ``[TOOL_CALLS]`` v3 and v11, generic JSON) parse to the expected OpenAI tool_calls; the
stream, fed in arbitrary chunks, reassembles to the same calls and content; the tool_choice
constraint only lets a model write calls that parse and validate against the tools' schemas."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("llguidance")

from kael.constraints import ConstraintError, ConstraintMatcher  # noqa: E402
from kael.tokenizer import BpeTokenizer  # noqa: E402
from kael_server.tools import (  # noqa: E402
    Format,
    ToolCallStream,
    detect_format,
    parse_tool_calls,
    tool_choice_constraint,
)

W = {"location": "Paris, France", "unit": "celsius"}
T = {"timezone": "Europe/Paris"}

# (format, output, expected content, expected [(name, arguments)])
CASES: list[tuple[Format, str, str | None, list[tuple[str, dict[str, Any]]]]] = [
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris, France", "unit": "celsius"}}\n</tool_call>',
        None,
        [("get_weather", W)],
    ),
    (
        "hermes",
        'Let me check both.\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris, France", '
        '"unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"timezone": '
        '"Europe/Paris"}}\n</tool_call>',
        "Let me check both.",
        [("get_weather", W), ("get_time", T)],
    ),
    (
        "hermes",
        "The weather in Paris is sunny (no <tool> needed).",
        "The weather in Paris is sunny (no <tool> needed).",
        [],
    ),
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"location": "Paris, France", "unit": "celsius"}}',
        None,
        [("get_weather", W)],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"location": "Paris, France", "unit": "celsius"}}; '
        '{"name": "get_time", "parameters": {"timezone": "Europe/Paris"}}',
        None,
        [("get_weather", W), ("get_time", T)],
    ),
    ("llama3_json", "It is 20 degrees {maybe} in Paris.", "It is 20 degrees {maybe} in Paris.", []),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"location": "Paris, France", "unit": "celsius"}}, '
        '{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}]',
        None,
        [("get_weather", W), ("get_time", T)],
    ),
    (
        "mistral",
        'Sure.[TOOL_CALLS]get_weather[ARGS]{"location": "Paris, France", "unit": "celsius"}'
        '[TOOL_CALLS]get_time[ARGS]{"timezone": "Europe/Paris"}',
        "Sure.",
        [("get_weather", W), ("get_time", T)],
    ),
    ("json", '[{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}]', None, [("get_time", T)]),
    ("json", '{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}', None, [("get_time", T)]),
    # broken calls are content, as vLLM's parsers leave them
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {"timezone": \n</tool_call>', None, []),
]


def _ids() -> Any:
    counter = itertools.count()
    return lambda fmt: f"call_{next(counter)}"


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
def test_parse_matches_the_documented_calls(fmt: Format, text: str, content: str | None, calls: list[Any]) -> None:
    turn = parse_tool_calls(text, fmt, id_factory=_ids())
    if not calls:
        assert turn.content == text and turn.tool_calls == []
        return
    assert turn.content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in turn.tool_calls] == calls
    assert [c["id"] for c in turn.tool_calls] == [f"call_{i}" for i in range(len(calls))]
    assert all(c["type"] == "function" and isinstance(c["function"]["arguments"], str) for c in turn.tool_calls)


def _replay(fmt: Format, text: str, cuts: list[int]) -> tuple[str, list[dict[str, Any]]]:
    """Feed ``text`` in the pieces ``cuts`` makes; reassemble as an OpenAI client does."""
    stream = ToolCallStream(fmt, id_factory=_ids())
    bounds = [0, *sorted(set(c % (len(text) + 1) for c in cuts)), len(text)]
    deltas = [d for a, b in itertools.pairwise(bounds) for d in stream.feed(text[a:b])] + stream.finish()
    content = ""
    calls: list[dict[str, Any]] = []
    for d in deltas:
        assert set(d) <= {"content", "tool_calls"}
        content += d.get("content", "")
        for tc in d.get("tool_calls", []):
            if "id" in tc:
                assert tc["index"] == len(calls) and tc["type"] == "function" and tc["function"]["arguments"] == ""
                calls.append({"id": tc["id"], "name": tc["function"]["name"], "arguments": ""})
            else:
                calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
    return content, calls


@settings(max_examples=30, deadline=None)
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_stream_in_any_chunks_reassembles_to_the_parse(case: Any, cuts: list[int]) -> None:
    fmt, text, content, calls = case
    got_content, got_calls = _replay(fmt, text, cuts)
    if not calls and "<tool_call>" not in text:
        assert got_content == text and got_calls == []
        return
    if not calls:
        return  # a broken call: the stream cannot take back what it announced
    assert (got_content.strip() or None) == content
    assert [(c["name"], json.loads(c["arguments"])) for c in got_calls] == calls


def test_stream_token_by_token_sends_name_first_then_fragments() -> None:
    text = CASES[1][1]
    stream = ToolCallStream("hermes", id_factory=_ids())
    deltas = [d for ch in text for d in stream.feed(ch)]
    kinds = ["content" if "content" in d else ("head" if "id" in d["tool_calls"][0] else "args") for d in deltas]
    assert kinds[0] == "content" and kinds.count("head") == 2
    first_head = kinds.index("head")
    assert all(k == "content" for k in kinds[:first_head]) and kinds[first_head + 1] == "args"
    assert sum(1 for k in kinds if k == "args") > 10  # arguments arrive in many fragments


def test_detect_format_from_template_text() -> None:
    qwen = '{%- if tools %}...<tools>{{ tool | tojson }}</tools>... <tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>'
    llama = '{{- "<|start_header_id|>ipython<|end_header_id|>" }}{{- \'{"name": "\' }} "parameters": ... <|python_tag|> <|eot_id|>'
    mistral = "{%- if message.tool_calls %}{{- '[TOOL_CALLS][' }}"
    assert [detect_format(t) for t in (qwen, llama, mistral, "{{ messages }}")] == [
        "hermes",
        "llama3_json",
        "mistral",
        "json",
    ]


TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "maxLength": 10},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["location", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"utc": {"type": "boolean"}},
                "required": ["utc"],
                "additionalProperties": False,
            },
        },
    },
]


@pytest.fixture(scope="module")
def tok() -> BpeTokenizer:
    return BpeTokenizer.from_directory(Path(__file__).resolve().parents[2] / "tests" / "data" / "gpt2-tokenizer")


def _walk(m: ConstraintMatcher, tok: BpeTokenizer, seed: int) -> str:
    rng = np.random.default_rng(seed)
    out: list[int] = []
    for _ in range(400):
        ids = m.allowed()
        if tok.eot_token in ids and (ids.size == 1 or rng.random() < 0.5):
            return tok.decode(out).decode()
        t = int(rng.choice(ids[ids != tok.eot_token]))
        m.accept(t)
        out.append(t)
    pytest.fail("no end")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_tool_choice_constraint_yields_calls_that_validate(tok: BpeTokenizer, choice: Any) -> None:
    c = tool_choice_constraint(TOOLS, choice)
    assert c is not None
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for seed in range(6):
        turn = parse_tool_calls(_walk(ConstraintMatcher(c, tok, tok.eot_token), tok, seed), "json")
        assert turn.tool_calls, turn.content
        for call in turn.tool_calls:
            name = call["function"]["name"]
            assert name in schemas and (choice == "required" or name == "get_time")
            jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[name])


def test_tool_choice_errors_name_the_field() -> None:
    assert tool_choice_constraint(TOOLS, "auto") is None and tool_choice_constraint(TOOLS, "none") is None
    with pytest.raises(
        ConstraintError,
        match=r"tool_choice.function.name: 'nope' is not one of the tools \['get_time', 'get_weather'\]",
    ):
        tool_choice_constraint(TOOLS, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ConstraintError, match=r"tools\[0\]: expected"):
        tool_choice_constraint([{"type": "function"}], "required")
    with pytest.raises(ConstraintError, match="needs a non-empty tools list"):
        tool_choice_constraint([], "required")
