"""Tests for kael.tokenizer's ChatTemplate against transformers' apply_chat_template.

Templates in the style of the common families (ChatML with a default system prompt as
Qwen2.5 writes it, SmolLM2's ChatML, Llama 3 headers, Llama 2 / Mistral ``[INST]`` with
``raise_exception`` when roles do not alternate, Zephyr) render to exactly the text
``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)``
gives for the same tokenizer. Malformed and hostile templates give FormatError or
ChatTemplateError with a short message that never repeats the template.
"""

from __future__ import annotations

import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from hf_fixtures import GPT2_DATA, write_byte_level, write_config, write_llama2, write_llama3  # noqa: E402
from kael import ChatTemplateError, FormatError, KaelError  # noqa: E402
from kael.tokenizer import BpeTokenizer, ChatTemplate, HFTokenizer, load_tokenizer  # noqa: E402

QWEN = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LLAMA3 = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)

ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

# namespace, loop controls, a generation block, dict() and tojson options
FEATURES = """{%- set ns = namespace(count=0, last='') -%}
{%- for m in messages -%}
  {%- if m.role == 'system' %}{% continue %}{% endif -%}
  {%- set ns.count = ns.count + 1 -%}
  {%- if ns.count > 3 %}{% break %}{% endif -%}
  [{{ ns.count }}:{{ m.role }}]
  {%- if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}
{% endfor -%}
{{ dict(a=1, b=[1, 2]) | tojson(indent=1, sort_keys=True) }}
{{ {'é': '<&>'} | tojson }}
{%- if add_generation_prompt %}[go]{% endif %}"""

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "user", "content": "  Hi  there \n"},
        {"role": "assistant", "content": "Hello, how can I help? 🙂"},
        {"role": "user", "content": 'Tell me a joke with <tags> & "quotes".'},
    ],
    [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "Ahoy"},
        {"role": "assistant", "content": "Arr!"},
        {"role": "user", "content": "中文 and émoji"},
        {"role": "assistant", "content": "¡Sí!"},
    ],
]

TEMPLATES = {
    "qwen": QWEN,
    "smollm2": SMOLLM2,
    "llama3": LLAMA3,
    "llama2": LLAMA2,
    "zephyr": ZEPHYR,
    "features": FEATURES,
}
TOKENIZER_OF = {
    "qwen": "byte_level",
    "smollm2": "byte_level",
    "llama3": "llama3",
    "llama2": "llama2",
    "zephyr": "llama2",
    "features": "byte_level",
}
WRITERS = {"byte_level": write_byte_level, "llama2": write_llama2, "llama3": write_llama3}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat")
    return {name: write(root / name) for name, write in WRITERS.items()}


@pytest.fixture(scope="module")
def hf_tokenizers(dirs: dict[str, Path]) -> dict[str, Any]:
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: AutoTokenizer.from_pretrained(path) for name, path in dirs.items()}


def _hf_render(hf: Any, template: str, messages: list[dict[str, Any]], add: bool, **kwargs: Any) -> str:
    return str(
        hf.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=add, **kwargs)
    )


@pytest.mark.parametrize("name", list(TEMPLATES))
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("add", [True, False])
def test_render_matches_apply_chat_template(
    hf_tokenizers: dict[str, Any], name: str, conversation: int, add: bool
) -> None:
    hf = hf_tokenizers[TOKENIZER_OF[name]]
    messages = CONVERSATIONS[conversation]
    template = ChatTemplate(TEMPLATES[name], bos_token=hf.bos_token, eos_token=hf.eos_token)
    expected = _hf_render(hf, TEMPLATES[name], messages, add)
    assert template.render(messages, add_generation_prompt=add) == expected
    assert expected  # a real comparison, not of two empty strings


def test_generation_prompt_defaults_to_true(hf_tokenizers: dict[str, Any]) -> None:
    messages = CONVERSATIONS[0]
    rendered = ChatTemplate(SMOLLM2).render(messages)
    assert rendered.endswith("<|im_start|>assistant\n")
    assert rendered == _hf_render(hf_tokenizers["byte_level"], SMOLLM2, messages, True)


def test_qwen_default_system_prompt_and_tools(hf_tokenizers: dict[str, Any]) -> None:
    hf = hf_tokenizers["byte_level"]
    template = ChatTemplate(QWEN)
    rendered = template.render([{"role": "user", "content": "hi"}])
    assert rendered.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"city": "Zürich <&>"}}}]
    messages = CONVERSATIONS[1]
    got = template.render(messages, tools=tools)
    assert got == _hf_render(hf, QWEN, messages, True, tools=tools)
    assert '"city": "Zürich <&>"' in got  # tojson neither escapes HTML nor non-ASCII


def test_llama2_roles_must_alternate(hf_tokenizers: dict[str, Any]) -> None:
    import jinja2

    hf = hf_tokenizers["llama2"]
    template = ChatTemplate(LLAMA2, bos_token="<s>", eos_token="</s>")
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(jinja2.exceptions.TemplateError, match="must alternate"):
        _hf_render(hf, LLAMA2, messages, True)
    with pytest.raises(
        ChatTemplateError, match=r"refused the messages: Conversation roles must alternate user/assistant"
    ):
        template.render(messages)


def test_llama3_sees_bos_and_template_variables(hf_tokenizers: dict[str, Any]) -> None:
    hf = hf_tokenizers["llama3"]
    template = ChatTemplate(LLAMA3, bos_token=hf.bos_token, eos_token=hf.eos_token)
    messages = CONVERSATIONS[1]
    got = template.render(messages, date_string="26 Jul 2024")
    assert got == _hf_render(hf, LLAMA3, messages, True, date_string="26 Jul 2024")
    assert got.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge")
    assert "Today Date: 26 Jul 2024" in got
    assert ChatTemplate("{{ strftime_now('%Y') }}").render([]) == str(datetime.now().year)
    assert ChatTemplate("{{ bos_token }}|{{ eos_token }}", bos_token="B").render([], eos_token="E") == "B|E"


def test_render_then_encode_matches_transformers_tokenized(
    hf_tokenizers: dict[str, Any], dirs: dict[str, Path]
) -> None:
    hf = hf_tokenizers["llama3"]
    tok = HFTokenizer.from_directory(dirs["llama3"])
    template = ChatTemplate(LLAMA3, bos_token=tok.bos_token, eos_token=tok.eos_token)
    messages = CONVERSATIONS[3]
    text = template.render(messages, date_string="1 Jan 2025")
    expected = hf.apply_chat_template(
        messages, chat_template=LLAMA3, tokenize=True, add_generation_prompt=True, date_string="1 Jan 2025"
    )
    expected_ids = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
    assert tok.encode(text, add_special_tokens=False) == list(expected_ids)


# -- loading from a directory ---------------------------------------------------------------


def test_from_directory_reads_jinja_json_and_config(tmp_path: Path) -> None:
    directory = write_llama2(tmp_path / "l2", chat_template=LLAMA2)
    template = ChatTemplate.from_directory(directory)
    assert template is not None and (template.bos_token, template.eos_token) == ("<s>", "</s>")
    assert template.render(CONVERSATIONS[0]) == "<s>[INST] Hello! [/INST]"
    assert "tokenizer_config.json chat_template" in template.name
    (directory / "chat_template.json").write_text('{"chat_template": "json {{ eos_token }}"}', encoding="utf-8")
    json_template = ChatTemplate.from_directory(directory)
    assert json_template is not None and json_template.render([]) == "json </s>"
    (directory / "chat_template.jinja").write_text("jinja {{ bos_token }}", encoding="utf-8")
    jinja_template = ChatTemplate.from_directory(directory)
    assert jinja_template is not None and jinja_template.render([]) == "jinja <s>"
    assert jinja_template.name.endswith("chat_template.jinja")
    assert ChatTemplate.from_directory(tmp_path) is None  # no files at all


def test_template_list_uses_default(tmp_path: Path, dirs: dict[str, Path]) -> None:
    entries = [{"name": "tool_use", "template": "tools!"}, {"name": "default", "template": "default {{ eos_token }}"}]
    directory = write_byte_level(tmp_path / "b", chat_template=entries)
    template = ChatTemplate.from_directory(directory)
    assert template is not None and template.render([]) == "default <|im_end|>"
    tok = load_tokenizer(directory)
    assert tok.chat_template is not None and tok.chat_template.render([]) == "default <|im_end|>"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ([{"name": "tool_use", "template": "x"}], r"lists no template named 'default' \(it has \['tool_use'\]\)"),
        (["x"], r"chat_template\[0\] must be an object with a string 'name' and 'template'"),
        ([{"name": "default", "template": 3}], r"chat_template\[0\] \('default'\) needs a string 'template'"),
        (7, r"chat_template must be a string or a list"),
    ],
)
def test_malformed_template_entries(tmp_path: Path, entry: object, message: str) -> None:
    directory = write_byte_level(tmp_path / "b")
    write_config(directory, chat_template=entry)
    with pytest.raises(FormatError, match=message):
        ChatTemplate.from_directory(directory)


def test_unreadable_template_files(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_bytes(b"\xff{{ x }}")
    with pytest.raises(FormatError, match=r"chat_template.jinja: not valid UTF-8 at byte 0"):
        ChatTemplate.from_directory(tmp_path)
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "chat_template.json").write_text("{}")
    with pytest.raises(FormatError, match=r"chat_template.json: expected a 'chat_template' entry"):
        ChatTemplate.from_directory(tmp_path)


# -- malformed and hostile templates ------------------------------------------------------------

SECRET = "SECRET-TEMPLATE-BODY-" * 20


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (SECRET + "\n\n{% for m in messages %}", r"mytpl, line 3: the chat template does not compile: Unexpected end"),
        (SECRET + "\n{{ messages | no_such_filter }}", r"mytpl, line 2: .*No filter named 'no_such_filter'"),
        (SECRET + "{% endif %}", r"mytpl, line 1: .*Encountered unknown tag 'endif'"),
    ],
)
def test_syntax_errors_are_format_errors_naming_the_line(source: str, message: str) -> None:
    with pytest.raises(FormatError, match=message) as info:
        ChatTemplate(source, name="mytpl")
    assert "SECRET-TEMPLATE-BODY" not in str(info.value)
    assert len(str(info.value)) < 400


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", r"the sandbox blocked an unsafe operation: .*__class__"),
        ("{{ cycler.__init__.__globals__ }}", r"the sandbox blocked an unsafe operation"),
        ("{% set xs = [] %}{{ xs.append(1) }}", r"the sandbox blocked an unsafe operation: .*append"),
        ("{% set ns = namespace(_hidden=1) %}", r"the sandbox blocked an unsafe operation: .*'_hidden'"),
        ("{% if add_generation_prompt %}{{ 1 | no_such_filter }}{% endif %}", r"No filter named 'no_such_filter'"),
        ("line one\n{{ messages[0].content // 0 }}", r"mytpl, line 2: rendering failed: TypeError"),
        (
            "line one\nline two\n{{ 1 // (messages | length - 1) }}",
            r"mytpl, line 3: rendering failed: ZeroDivisionError",
        ),
        ("{{ raise_exception('no system messages, please') }}", r"refused the messages: no system messages, please"),
        ("{{ raise_exception(" + repr(SECRET) + ") }}", r"refused the messages: SECRET"),
    ],
)
def test_render_failures_are_chat_template_errors(source: str, message: str) -> None:
    template = ChatTemplate(source, name="mytpl")
    with pytest.raises(ChatTemplateError, match=message) as info:
        template.render([{"role": "user", "content": "x"}])
    assert str(info.value).startswith("mytpl")
    assert len(str(info.value)) < 400  # never the whole template or input


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ("hello", r"messages must be a list of \{role, content\} objects, got str"),
        (None, r"messages must be a list of \{role, content\} objects, got NoneType"),
        (
            [{"role": "user", "content": "a"}, "b"],
            r"messages\[1\] must be an object with 'role' and 'content', got str",
        ),
        (
            [{"role": "function", "content": "a"}],
            r"messages\[0\].role must be one of \['system', 'user', 'assistant', 'tool'\], got role 'function'",
        ),
        ([{"content": "a"}], r"messages\[0\].role must be one of .*got no role"),
        ([{"role": "user"}], r"messages\[0\].content is missing"),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": None}], r"messages\[1\].content is missing"),
        ([{"role": "user", "content": ["a"]}], r"messages\[0\].content must be a string, got list"),
    ],
)
def test_bad_messages_name_the_index_and_field(messages: Any, message: str) -> None:
    with pytest.raises(ChatTemplateError, match=message):
        ChatTemplate(SMOLLM2).render(messages)


def test_non_string_template_and_error_types() -> None:
    with pytest.raises(FormatError, match=r"chat_template: a chat template must be a string, got int"):
        ChatTemplate(3)  # type: ignore[arg-type]
    assert issubclass(ChatTemplateError, KaelError) and issubclass(ChatTemplateError, ValueError)
    template = ChatTemplate("x", name="n")
    assert template.source == "x" and template.name == "n" and "ChatTemplate(name='n'" in repr(template)


def test_rich_objects_reach_the_template_as_placeholders() -> None:
    class Shady:
        def delete_everything(self) -> str:
            raise AssertionError("the template must not reach this")

    template = ChatTemplate("{{ messages[0].extra }}|{{ thing }}")
    messages = [{"role": "user", "content": "a", "extra": Shady()}]
    assert template.render(messages, thing=Shady(), add_generation_prompt=False) == "<Shady>|<Shady>"


# -- end of turn ---------------------------------------------------------------------------------


def test_end_of_turn_tokens(dirs: dict[str, Path]) -> None:
    byte_level = HFTokenizer.from_directory(dirs["byte_level"])
    llama2 = HFTokenizer.from_directory(dirs["llama2"])
    llama3 = HFTokenizer.from_directory(dirs["llama3"])
    im_end = byte_level.special_tokens["<|im_end|>"]
    assert ChatTemplate(QWEN).end_of_turn_tokens(byte_level) == (im_end,)
    assert ChatTemplate(SMOLLM2, eos_token="<|im_end|>").end_of_turn_tokens(byte_level) == (im_end,)
    eot = llama3.special_tokens["<|eot_id|>"]
    assert ChatTemplate(LLAMA3, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>").end_of_turn_tokens(llama3) == (
        eot,
    )
    # Llama 3.1 also writes <|eom_id|>; a template naming <|end_of_text|> gets it after the rendered ender
    both = ChatTemplate(LLAMA3 + "{# <|end_of_text|> #}", eos_token="<|eot_id|>")
    assert both.end_of_turn_tokens(llama3) == (eot, llama3.special_tokens["<|end_of_text|>"])
    # [INST] and Zephyr templates end an assistant turn with eos_token (rendered, not written)
    assert ChatTemplate(LLAMA2, bos_token="<s>", eos_token="</s>").end_of_turn_tokens(llama2) == (2,)
    assert ChatTemplate(ZEPHYR, eos_token="</s>").end_of_turn_tokens(llama2) == (2,)
    # a template that cannot render the probe still finds the enders it writes
    refusing = ChatTemplate("{{ raise_exception('no') }}<|im_end|>")
    assert refusing.end_of_turn_tokens(byte_level) == (im_end,)
    assert ChatTemplate("{{ messages[0].content }}").end_of_turn_tokens(byte_level) == ()


def test_end_of_turn_tokens_with_gpt2_bpe_tokenizer() -> None:
    gpt2 = BpeTokenizer.from_directory(GPT2_DATA)
    template = ChatTemplate(SMOLLM2 + "{{ eos_token }}", eos_token="<|endoftext|>")
    assert template.end_of_turn_tokens(gpt2) == (50256,)
