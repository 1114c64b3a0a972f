"""kael_server.tools' ``tool_choice: "auto"`` grammar: in each format, the documented model
outputs (free text, one call, two calls, Mistral v3 and v11) are accepted token by token and
complete; once a call is opened, whatever the model picks among the allowed tokens ends as calls
that ``parse_tool_calls`` reads and whose arguments validate against the tools' schemas (the
``jsonschema`` oracle); a malformed call is refused at the first bad token. Markers that are
special tokens (Mistral's ``[TOOL_CALLS]``, Llama's ``<|python_tag|>``) are taken as the token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

pytest.importorskip("llguidance")
tokenizers = pytest.importorskip("tokenizers")

from kael.constraints import ConstraintError, ConstraintMatcher, grammar  # noqa: E402
from kael.tokenizer import BpeTokenizer, HFTokenizer  # noqa: E402
from kael_server.tools import Format, auto_grammar, parse_tool_calls  # noqa: E402

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "maxLength": 16},
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
                "properties": {"timezone": {"type": "string", "maxLength": 16}},
                "required": ["timezone"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
W = '{"location": "Paris, France", "unit": "celsius"}'
T = '{"timezone": "Europe/Paris"}'
V11 = "{{ '[TOOL_CALLS]' + name + '[ARGS]' + arguments }}"

# (format, template, reply, number of calls in it)
REPLIES: list[tuple[Format, str, str, int]] = [
    ("hermes", "", "The weather in Paris is sunny (no <tool> needed).", 0),
    ("hermes", "", f'<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>', 1),
    (
        "hermes",
        "",
        f'Let me check both.\n<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>\n'
        f'<tool_call>\n{{"name": "get_time", "arguments": {T}}}\n</tool_call>',
        2,
    ),
    ("llama3_json", "", "It is 20 degrees {maybe} in Paris.", 0),
    ("llama3_json", "", f'{{"name": "get_weather", "parameters": {W}}}', 1),
    (
        "llama3_json",
        "",
        f'<|python_tag|>{{"name": "get_weather", "parameters": {W}}}; {{"name": "get_time", "parameters": {T}}}',
        2,
    ),
    ("mistral", "", "No tools needed [TOOL] here.", 0),
    (
        "mistral",
        "",
        f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {W}}}, {{"name": "get_time", "arguments": {T}}}]',
        2,
    ),
    ("mistral", V11, f"Sure.[TOOL_CALLS]get_weather[ARGS]{W}[TOOL_CALLS]get_time[ARGS]{T}", 2),
    ("json", "", "Paris is sunny.", 0),
    ("json", "", f'{{"name": "get_time", "arguments": {T}}}', 1),
    ("json", "", f'[{{"name": "get_time", "arguments": {T}}}, {{"name": "get_weather", "arguments": {W}}}]', 2),
]

# (format, template, a reply whose call breaks its tool's schema)
BROKEN: list[tuple[Format, str, str]] = [
    ("hermes", "", '<tool_call>\n{"name": "get_time", "arguments": {"tz": "x"}}\n</tool_call>'),
    ("hermes", "", '<tool_call>\n{"name": "get_date", "arguments": {}}\n</tool_call>'),
    ("llama3_json", "", '{"name": "get_weather", "parameters": {"location": "Paris", "unit": "kelvin"}}'),
    ("mistral", "", '[TOOL_CALLS][{"name": "get_time", "arguments": {"timezone": 3}}]'),
    ("mistral", V11, '[TOOL_CALLS]get_time[ARGS]{"zone": "x"}'),
    ("json", "", '[{"name": "get_time"}]'),
    # the parser skips leading whitespace: a call after it is no plain text either
    ("json", "", ' {"name": "get_time", "arguments": {"tz": 1}}'),
    ("llama3_json", "", '\n<|python_tag|>{"name": "get_time", "parameters": {"tz": 1}}'),
]

# (format, template, the text that opens a call)
OPENERS: list[tuple[Format, str, str]] = [
    ("hermes", "", "Let me look.\n<tool_call>\n"),
    ("llama3_json", "", "<|python_tag|>"),
    ("llama3_json", "", '{"name": '),
    ("mistral", "", "[TOOL_CALLS]"),
    ("mistral", V11, "One moment.[TOOL_CALLS]"),
    ("json", "", "["),
]


@pytest.fixture(scope="module")
def gpt2() -> BpeTokenizer:
    return BpeTokenizer.from_directory(Path(__file__).resolve().parents[2] / "tests" / "data" / "gpt2-tokenizer")


@pytest.fixture(scope="module")
def with_specials(tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    """A byte-level BPE trained here, with ``[TOOL_CALLS]``, ``[ARGS]`` and ``<|python_tag|>`` as
    special tokens (as Mistral's and Llama 3.1's tokenizers have them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    specials = ["</s>", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [json.dumps(t) for t in TOOLS] + [W, T, "Sure, the weather in Paris is sunny. One moment."] * 20
    tk.train_from_iterator(corpus, trainer)
    d = tmp_path_factory.mktemp("specials")
    tk.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return HFTokenizer.from_directory(d)


def _matcher(tok: Any, fmt: Format, template: str, *, parallel: bool = True) -> ConstraintMatcher:
    text = auto_grammar(TOOLS, fmt, parallel=parallel, special_tokens=tok.special_tokens, template=template)
    return ConstraintMatcher(grammar(text, field="tools"), tok, tok.eot_token)


def _feed(m: ConstraintMatcher, ids: list[int]) -> None:
    for t in ids:
        m.accept(t)


def _walk(m: ConstraintMatcher, tok: Any, seed: int) -> list[int]:
    """Tokens chosen at random among the allowed ones (ending when the end token is picked)."""
    rng = np.random.default_rng(seed)
    out: list[int] = []
    for _ in range(600):
        ids = m.allowed()
        if tok.eot_token in ids and (ids.size == 1 or rng.random() < 0.3):
            return out
        t = int(rng.choice(ids[ids != tok.eot_token]))
        m.accept(t)
        out.append(t)
    pytest.fail("the walk did not end")


def _check_calls(text: str, fmt: Format, n: int | None = None) -> None:
    turn = parse_tool_calls(text, fmt)
    assert turn.tool_calls, f"no call parsed from {text!r}"
    if n is not None:
        assert len(turn.tool_calls) == n
    for call in turn.tool_calls:
        name = call["function"]["name"]
        assert name in SCHEMAS, text
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


@pytest.mark.parametrize(("fmt", "template", "reply", "n"), REPLIES)
def test_documented_replies_are_accepted_and_complete(
    gpt2: BpeTokenizer, fmt: Format, template: str, reply: str, n: int
) -> None:
    m = _matcher(gpt2, fmt, template)
    _feed(m, gpt2.encode(reply))
    assert m.is_accepting
    assert gpt2.eot_token in m.allowed()
    if n:
        _check_calls(reply, fmt, n)
    else:
        assert not parse_tool_calls(reply, fmt).tool_calls


@pytest.mark.parametrize(("fmt", "template", "reply"), BROKEN)
def test_a_call_that_breaks_its_schema_is_refused(gpt2: BpeTokenizer, fmt: Format, template: str, reply: str) -> None:
    m = _matcher(gpt2, fmt, template)
    with pytest.raises(ConstraintError, match="tools: token"):
        _feed(m, gpt2.encode(reply))


@pytest.mark.parametrize(("fmt", "template", "opener"), OPENERS)
def test_an_opened_call_always_ends_as_valid_calls(gpt2: BpeTokenizer, fmt: Format, template: str, opener: str) -> None:
    for seed in range(4):
        m = _matcher(gpt2, fmt, template)
        head = gpt2.encode(opener)
        _feed(m, head)
        text = gpt2.decode(head + _walk(m, gpt2, seed)).decode()
        _check_calls(text, fmt)


def test_one_call_only_without_parallel_calls(gpt2: BpeTokenizer) -> None:
    m = _matcher(gpt2, "hermes", "", parallel=False)
    one = f'<tool_call>\n{{"name": "get_time", "arguments": {T}}}\n</tool_call>'
    _feed(m, gpt2.encode(one))
    assert m.is_accepting
    with pytest.raises(ConstraintError):
        _feed(m, gpt2.encode("\n<tool_call>"))


def test_free_text_never_holds_a_marker(gpt2: BpeTokenizer) -> None:
    """Once ``<tool_call>`` is written the reply is a call: plain text cannot follow it."""
    m = _matcher(gpt2, "hermes", "")
    _feed(m, gpt2.encode("I will not call <tool_call>"))
    assert not m.is_accepting
    with pytest.raises(ConstraintError):
        _feed(m, gpt2.encode(" just kidding"))


@pytest.mark.parametrize(
    ("fmt", "template", "marker"),
    [("mistral", "", "[TOOL_CALLS]"), ("mistral", V11, "[TOOL_CALLS]"), ("llama3_json", "", "<|python_tag|>")],
)
def test_special_token_markers_are_taken_as_the_token(
    with_specials: HFTokenizer, fmt: Format, template: str, marker: str
) -> None:
    tok = with_specials
    mark = tok.special_tokens[marker]
    for seed in range(3):
        m = _matcher(tok, fmt, template)
        head = tok.encode("Sure." if fmt == "mistral" else "", add_special_tokens=False)
        _feed(m, head)
        assert mark in m.allowed()
        m.accept(mark)
        ids = head + [mark] + _walk(m, tok, seed)
        _check_calls(tok.decode_text(ids), fmt)
    m = _matcher(tok, fmt, template)  # text that is not the marker is plain text: no call opened
    _feed(m, tok.encode(marker.replace("[", "[ ").replace("<", "< "), add_special_tokens=False))
    assert m.is_accepting
