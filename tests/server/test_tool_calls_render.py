"""kael_server.tools.render_with_tools against transformers' apply_chat_template(tools=) on a
Qwen2.5-style and a Llama-3.1-style template (their tools and tool-call sections): OpenAI
messages (arguments as JSON strings) render as Hugging Face renders the dict arguments.
(kael's ChatTemplate refuses the ``tool`` role today, so tool-result turns are not rendered.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kael import KaelError
from kael.tokenizer import ChatTemplate
from kael_server.tools import render_with_tools

transformers = pytest.importorskip("transformers")

QWEN = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}"
    '{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
    'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}'
    '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
    '{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}\\n</tool_call><|im_end|>\\n" }}'
    "{%- elif messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA = (
    "{{- bos_token }}{%- set user_msg = messages[0]['content'] %}"
    '{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}'
    '{{- "Environment: ipython\\n" if tools is not none else "" }}'
    '{{- "Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n<|eot_id|>" }}'
    "{%- for message in messages %}"
    "{%- if message.role == 'user' and loop.first and tools is not none %}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}"
    '{{- "Given the following functions, please respond with a JSON for a function call with its proper arguments '
    'that best answers the given prompt.\\n\\n" }}'
    '{{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}'
    '{{- "Do not use variables.\\n\\n" }}'
    '{%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}'
    "{{- message.content + '<|eot_id|>' }}"
    "{%- elif message.role == 'user' %}{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- elif 'tool_calls' in message %}{%- set tool_call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
    '{{- \'{"name": "\' + tool_call.name + \'", \' }}{{- \'"parameters": \' }}{{- tool_call.arguments | tojson }}{{- "}" }}{{- "<|eot_id|>" }}'
    '{%- elif message.role == "tool" or message.role == "ipython" %}'
    '{{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}{{- message.content | tojson }}{{- "<|eot_id|>" }}'
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city (°C or °F).",
            "parameters": {
                "type": "object",
                "properties": {"location": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["location"],
            },
        },
    }
]
ARGS = {"location": "Zürich", "unit": "celsius"}


def _messages(args: Any) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Weather in Zürich?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}
            ],
        },
    ]


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    d = Path(__file__).resolve().parents[2] / "tests" / "data" / "gpt2-tokenizer"
    return transformers.GPT2TokenizerFast(vocab_file=str(d / "vocab.json"), merges_file=str(d / "merges.txt"))


@pytest.mark.parametrize("source", [QWEN, LLAMA], ids=["qwen2.5", "llama3.1"])
@pytest.mark.parametrize("with_tools", [True, False])
def test_render_equals_apply_chat_template(hf_tokenizer: Any, source: str, with_tools: bool) -> None:
    tools = TOOLS if with_tools else None
    expect = hf_tokenizer.apply_chat_template(
        _messages(ARGS),
        tools=tools,
        chat_template=source,
        tokenize=False,
        add_generation_prompt=True,
        bos_token="<BOS>",
    )
    got = render_with_tools(ChatTemplate(source, bos_token="<BOS>"), _messages(json.dumps(ARGS)), tools)
    assert got == expect
    assert ('"location": "Z' in got) and ("get_weather" in got)


def test_bad_arguments_string_is_named() -> None:
    with pytest.raises(KaelError, match=r"messages\[1\]\.tool_calls\[0\]\.function\.arguments: not valid JSON"):
        render_with_tools(ChatTemplate(QWEN), _messages("{oops"), TOOLS)
    with pytest.raises(KaelError, match="expected a JSON object"):
        render_with_tools(ChatTemplate(QWEN), _messages("[1]"), TOOLS)
