"""kael_server.tools against a reference parser (issue 30, acceptance point 2): every model
output in each supported tool-call format parses into the same content and ``tool_calls`` with
kael's ``parse_tool_calls`` / ``ToolCallStream`` as with transformers' declarative response
parser (``transformers.utils.chat_parsing``: ``parse_response`` and the streaming
``ResponseParser``), streaming and not: the documented replies of test_tool_calls.py plus more
(two calls per turn in every format, content before and after calls, unicode, escaped quotes,
nested arguments, whitespace variants), hypothesis-generated replies, text cut into arbitrary
chunks, and replies generated token by token (GPT-2 ids; the reference decoding the ids itself,
kael's stream fed what kael's incremental decoder completes per id).

The response templates, one per format, and the comparison helpers are in tool_reference.py
(``hermes``: transformers' own Qwen template; the others written faithfully to the vendors'
chat templates, see there).

The reference's message is read as OpenAI-style calls: ``arguments`` given as a JSON string (as
some fine-tunes write them) are decoded, and a call without ``arguments`` calls with ``{}``.

Where the two disagree, the formats' documentation decides (``DISAGREE``, each with its reason):
a call whose JSON does not parse makes the reference raise ``ValueError``; kael follows vLLM's
parsers and the OpenAI API and answers the whole output as content with no calls
(``test_broken_calls_are_content``). Where the reference raises on, or drops, text the formats'
documentation allows or that a model plainly wrote (text both before and after calls, a marker
inside a JSON string, the ``arguments`` key Llama 3's vLLM parser also takes, trailing text after
the calls), kael's documented result is asserted instead.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("llguidance")
pytest.importorskip("transformers")

from kael.tokenizer import BpeTokenizer  # noqa: E402
from kael_server.tools import Format  # noqa: E402
from transformers.models.gpt2.tokenization_gpt2 import GPT2Tokenizer  # noqa: E402
from transformers.utils.chat_parsing import ResponseParser, parse_response  # noqa: E402

from .test_tool_calls import CASES as DOCUMENTED_CASES  # noqa: E402
from .tool_reference import Calls, kael_stream, kael_turn, reference_stream, reference_turn, template_for  # noqa: E402

__all__: list[str] = []


W = {"location": "Paris, France", "unit": "celsius"}
UNI = {"city": "Zürich", "note": "東京 → 🌧️", "quote": 'she said "hi" \\ bye'}
NESTED = {"filter": {"range": {"min": 1, "max": [2, 3.5]}, "tags": ["a", {"b": None}]}, "dry_run": True}


def _hermes(*calls: tuple[str, Any], sep: str = "\n", pre: str = "") -> str:
    body = sep.join(
        f"<tool_call>\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n</tool_call>" for n, a in calls
    )
    return pre + body


def _llama(*calls: tuple[str, Any], sep: str = "; ", tag: str = "<|python_tag|>") -> str:
    return tag + sep.join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls)


def _mistral_v3(*calls: tuple[str, Any], pre: str = "", gap: str = "") -> str:
    items = ", ".join(json.dumps({"name": n, "arguments": a}, ensure_ascii=False) for n, a in calls)
    return f"{pre}[TOOL_CALLS]{gap}[{items}]"


def _mistral_v11(*calls: tuple[str, Any], pre: str = "") -> str:
    return pre + "".join(f"[TOOL_CALLS]{n}[ARGS]{json.dumps(a, ensure_ascii=False)}" for n, a in calls)


# (format, model output) beyond the documented CASES: two calls per turn in each format, content
# before calls, unicode and escaped quotes, nested arguments, whitespace the formats allow
MORE: list[tuple[Format, str]] = [
    ("hermes", _hermes(("get_weather", W), ("search", UNI))),
    ("hermes", _hermes(("query", NESTED), pre="Sure — I'll look that up.\n\n")),
    ("hermes", _hermes(("get_weather", W), ("query", NESTED), sep="\n\n")),
    ("hermes", '<tool_call>{"name":"get_time","arguments":{}}</tool_call>'),
    ("hermes", '<tool_call>\n  {"name" : "f", "arguments" : {"a" : "x } y { z"}}  \n</tool_call>'),
    ("hermes", 'Plain answer with JSON {"a": 1} and no call.'),
    ("llama3_json", _llama(("get_weather", W), ("search", UNI))),
    ("llama3_json", _llama(("query", NESTED), tag="")),
    ("llama3_json", _llama(("get_weather", W), ("query", NESTED), sep=";", tag="")),
    ("llama3_json", "  " + _llama(("search", UNI), tag="<|python_tag|> ")),
    ("llama3_json", '{"name": "f", "parameters": {"s": "a ; b"}}'),
    ("llama3_json", "Sure! I can't call a tool for that."),
    ("mistral", _mistral_v3(("get_weather", W))),
    ("mistral", _mistral_v3(("search", UNI), ("query", NESTED), pre="Checking.")),
    ("mistral", _mistral_v3(("get_weather", W), gap=" ")),
    ("mistral", _mistral_v11(("query", NESTED))),
    ("mistral", _mistral_v11(("search", UNI), ("get_weather", W), pre="Let me see. ")),
    ("mistral", "No tools needed [really]."),
    (
        "json",
        json.dumps([{"name": "get_weather", "arguments": W}, {"name": "search", "arguments": UNI}], ensure_ascii=False),
    ),
    ("json", json.dumps({"name": "query", "arguments": NESTED}, indent=2)),
    ("json", '\n [ {"name": "f", "arguments": {"q": "\\"quoted\\""}} ]'),
    ("json", '[{"name": "f", "arguments": {"a": 1}},{"name": "g", "arguments": {}}]'),
    # text after the calls, calls in any key order, escapes, unclosed last call at the end
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\nDone, waiting.'),
    ("hermes", '<tool_call>\n{"arguments": {"a": "\\u00fc\\n"}, "name": "f"}\n</tool_call>'),
    (
        "hermes",
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\nthen\n<tool_call>{"name": "g", "arguments": {}}',
    ),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "f"}\n</tool_call>'),
    ("llama3_json", '\n{"name": "f", "parameters": {"a": 1}} ; {"name": "g", "parameters": {}}\n'),
    ("llama3_json", '<|python_tag|>brave_search.call(query="x")'),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}, "id": "abcdefghi"}]\n'),
    ("mistral", '[TOOL_CALLS]f[ARGS] {"a": 1}'),
]

# (format, output, kael's content, kael's calls, why the reference is not followed)
DISAGREE: list[tuple[Format, str, str | None, Calls, str]] = [
    (
        "hermes",
        'Before.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\nAfter.',
        "Before.\n\nAfter.",
        [("f", {})],
        "the reference's content region does not repeat: the text after the call overwrites the text before",
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}} \n</tool_call>\n<tool_call>{"name": "g", "arguments": {"s": "</tool_call>"}}</tool_call>',
        None,
        [("f", {"a": 1}), ("g", {"s": "</tool_call>"})],
        "the reference closes the call at a </tool_call> inside a JSON string",
    ),
    (
        "mistral",
        '[TOOL_CALLS]f[ARGS]{"a": "[TOOL_CALLS] x"}',
        None,
        [("f", {"a": "[TOOL_CALLS] x"})],
        "the reference ends the arguments at a [TOOL_CALLS] inside a JSON string",
    ),
    (
        "llama3_json",
        '{"name": "f", "arguments": {"a": 1}}',
        None,
        [("f", {"a": 1})],
        "Llama 3.1's card names the key 'parameters'; vLLM's llama3_json parser also takes 'arguments'",
    ),
    (
        "llama3_json",
        '{"name": "f", "parameters": {"a": 1}} and that is all',
        "and that is all",
        [("f", {"a": 1})],
        "text after the calls is no JSON: the reference raises; kael keeps the call and the text",
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}] trailing',
        "trailing",
        [("f", {"a": 1})],
        "text after the v3 list: the reference raises; kael keeps the call and the text",
    ),
    (
        "mistral",
        '[TOOL_CALLS]f[ARGS]{"a": 1} trailing',
        "trailing",
        [("f", {"a": 1})],
        "text after the v11 arguments: the reference raises; kael keeps the call and the text",
    ),
    (
        "json",
        '{"name": "f", "arguments": {"a": 1}}\n{"name": "g", "arguments": {}}',
        None,
        [("f", {"a": 1}), ("g", {})],
        "several objects (what a model without a list writes): the reference parses one JSON value only",
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}} (done)\n</tool_call>',
        None,
        [("f", {"a": 1})],
        "text after the object inside the call: the reference raises; kael's stream has already sent the"
        " finished call, so the whole parse keeps it too (stream and parse never disagree)",
    ),
    (
        "llama3_json",
        '{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {}}',
        None,
        [("f", {"a": 1}), ("g", {})],
        "calls separated by ',' rather than Llama's ';': the reference raises; kael takes both",
    ),
    (
        "json",
        "[]",
        "[]",
        [],
        "the reference drops the reply entirely; with no call kael answers the text as content",
    ),
]


def _parses(fmt: Format, text: str) -> bool:
    try:
        parse_response(text, template_for(fmt, text), prefix="")
    except ValueError:
        return False
    return True


ALL = [(f, t) for f, t, _, _ in DOCUMENTED_CASES] + MORE
AGREED = [c for c in ALL if _parses(*c)]
BROKEN = [c for c in ALL if not _parses(*c)]


def test_every_format_has_two_call_turns_checked() -> None:
    two = {f for f, t in AGREED if len(reference_turn(parse_response(t, template_for(f, t), prefix=""))[1]) == 2}
    assert two == {"hermes", "llama3_json", "mistral", "json"}
    assert len(AGREED) >= 25


@pytest.mark.parametrize(("fmt", "text"), AGREED)
def test_parse_matches_the_reference(fmt: Format, text: str) -> None:
    ref = reference_turn(parse_response(text, template_for(fmt, text), prefix=""))
    got = kael_turn(text, fmt)
    assert got == ref


@pytest.mark.parametrize(("fmt", "text", "content", "calls", "why"), DISAGREE)
def test_where_the_reference_is_limited_kael_follows_the_format(
    fmt: Format, text: str, content: str | None, calls: Calls, why: str
) -> None:
    try:
        ref: object = reference_turn(parse_response(text, template_for(fmt, text), prefix=""))
    except ValueError:
        ref = "raises"
    assert ref != (content, calls), f"the reference agrees now: move the case to MORE ({why})"
    assert kael_turn(text, fmt) == (content, calls)
    n = len(text)
    for bounds in ([0, n], list(range(n + 1)), sorted({0, n // 3, n // 2, n})):
        assert kael_stream(text, fmt, bounds) == (content, calls)


@pytest.mark.parametrize(("fmt", "text"), BROKEN)
def test_broken_calls_are_content(fmt: Format, text: str) -> None:
    # transformers' parser raises on a call whose JSON does not parse; kael (as vLLM's parsers
    # and the OpenAI API) answers the whole output as content with no calls
    assert kael_turn(text, fmt) == (text, [])


@pytest.mark.parametrize(("fmt", "text"), AGREED)
def test_stream_split_inside_the_call_matches_the_reference(fmt: Format, text: str) -> None:
    # cuts inside the opening marker, inside the name and inside the arguments
    n = len(text)
    bounds = sorted({0, *(max(1, n * k // 7) for k in range(1, 7)), n})
    want = reference_turn(parse_response(text, template_for(fmt, text), prefix=""))
    assert reference_stream(text, fmt, bounds) == want
    assert kael_stream(text, fmt, bounds) == want


@settings(max_examples=150, deadline=None)
@given(case=st.sampled_from(AGREED), cuts=st.lists(st.integers(0, 10_000), max_size=16), one_by_one=st.booleans())
def test_stream_in_any_chunks_matches_the_reference_stream(
    case: tuple[Format, str], cuts: list[int], one_by_one: bool
) -> None:
    fmt, text = case
    points = range(len(text) + 1) if one_by_one else {c % (len(text) + 1) for c in cuts}
    bounds = sorted({0, *points, len(text)})
    ref = reference_stream(text, fmt, bounds)
    assert ref == reference_turn(parse_response(text, template_for(fmt, text), prefix=""))
    assert kael_stream(text, fmt, bounds) == ref


_SAFE = st.characters(exclude_categories=["Cs"], exclude_characters="<>[];{}")
_ARGS = st.dictionaries(
    st.text(_SAFE, max_size=8),
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**53), 2**53)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(_SAFE, max_size=12),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(_SAFE, max_size=6), inner, max_size=3),
        max_leaves=8,
    ),
    max_size=4,
)
_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)


@st.composite
def replies(draw: st.DrawFn) -> tuple[Format, str]:
    """A model output in a random format: 1-3 calls with random names and arguments (unicode,
    quotes, backslashes, newlines, nesting), random JSON spacing, content before where the
    format allows it. Marker characters stay out of strings (see DISAGREE for those)."""
    fmt = draw(st.sampled_from(["hermes", "llama3_json", "mistral_v3", "mistral_v11", "json"]))
    calls = draw(st.lists(st.tuples(_NAME, _ARGS), min_size=1, max_size=3))
    ascii_only = draw(st.booleans())
    seps = draw(st.sampled_from([(", ", ": "), (",", ":"), (" , ", " : ")]))

    def dump(value: Any) -> str:
        return json.dumps(value, ensure_ascii=ascii_only, separators=seps)

    pre = draw(st.text(_SAFE, max_size=20)) if fmt in ("hermes", "mistral_v3", "mistral_v11") else ""
    if fmt == "hermes":
        gap = draw(st.sampled_from(["\n", "", "\n\n", " "]))
        text = pre + gap.join(f"<tool_call>{gap}{dump({'name': n, 'arguments': a})}{gap}</tool_call>" for n, a in calls)
        return "hermes", text
    if fmt == "llama3_json":
        tag = draw(st.sampled_from(["", "<|python_tag|>", " <|python_tag|>\n"]))
        sep = draw(st.sampled_from(["; ", ";", " ;\n"]))
        return "llama3_json", tag + sep.join(dump({"name": n, "parameters": a}) for n, a in calls)
    if fmt == "mistral_v3":
        return "mistral", f"{pre}[TOOL_CALLS][{', '.join(dump({'name': n, 'arguments': a}) for n, a in calls)}]"
    if fmt == "mistral_v11":
        return "mistral", pre + "".join(f"[TOOL_CALLS]{n}[ARGS]{dump(a)}" for n, a in calls)
    body = [{"name": n, "arguments": a} for n, a in calls]
    return "json", dump(body if len(calls) > 1 or draw(st.booleans()) else body[0])


@settings(max_examples=200, deadline=None)
@given(reply=replies(), cuts=st.lists(st.integers(0, 10_000), max_size=10))
def test_random_replies_match_the_reference_streaming_and_not(reply: tuple[Format, str], cuts: list[int]) -> None:
    fmt, text = reply
    want = reference_turn(parse_response(text, template_for(fmt, text), prefix=""))
    assert kael_turn(text, fmt) == want
    bounds = sorted({0, *(c % (len(text) + 1) for c in cuts), len(text)})
    assert reference_stream(text, fmt, bounds) == want
    assert kael_stream(text, fmt, bounds) == want


GPT2_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "gpt2-tokenizer"


@pytest.fixture(scope="module")
def gpt2_pair() -> tuple[BpeTokenizer, Any]:
    """kael's GPT-2 tokenizer and transformers' fast one over the same vocabulary."""
    hf = GPT2Tokenizer(str(GPT2_DIR / "vocab.json"), str(GPT2_DIR / "merges.txt"))
    return BpeTokenizer.from_directory(GPT2_DIR), hf


@pytest.mark.parametrize(("fmt", "text"), AGREED)
def test_token_by_token_as_a_server_streams_matches_the_reference(
    gpt2_pair: tuple[BpeTokenizer, Any], fmt: Format, text: str
) -> None:
    # the reply as a model generates it: GPT-2 token ids, the reference parser fed the ids one
    # by one (its own incremental decoding), kael's stream fed what kael's incremental decoder
    # completes per id (multi-byte characters held back until whole), as kael-server streams
    kael_tok, hf_tok = gpt2_pair
    ids = kael_tok.encode(text)
    assert ids == hf_tok.encode(text)
    parser = ResponseParser(template_for(fmt, text), prefix=[], tokenizer=hf_tok)
    decoder = kael_tok.incremental_decoder()
    pieces = []
    for i in ids:
        parser.feed([i])
        pieces.append(decoder.add(i))
    pieces.append(decoder.flush())
    assert "".join(pieces) == text
    want = reference_turn(parser.finalize()[0])
    assert want == reference_turn(parse_response(text, template_for(fmt, text), prefix=""))
    hf_tok.response_template = template_for(fmt, text)  # as a model repo ships it
    assert reference_turn(hf_tok.parse_response(ids, prefix=[])) == want
    bounds = list(itertools.accumulate([0, *map(len, pieces)]))
    assert kael_stream(text, fmt, bounds) == want
