"""Offline chat checkpoints for the server tests: random weights, small trained tokenizers, chat templates.

* ``write_llama``: a transformers ``LlamaForCausalLM`` (grouped-query attention: 4 query
  heads over 2 key/value heads) saved with ``save_pretrained``, a byte-level BPE
  ``tokenizer.json`` trained with the ``tokenizers`` library whose post-processor adds the
  BOS ``<s>`` (as Llama 3's does), a ChatML template that starts with ``{{ bos_token }}``
  and a ``generation_config.json`` with two eos ids;
* ``write_gpt2``: a random kael GPT-2 over the bundled kael-tiny vocabulary (bytes and
  ``<|endoftext|>``) with a chat template in ``tokenizer_config.json``.

The oracle of a rendered and encoded conversation is ``transformers.AutoTokenizer``'s
``apply_chat_template`` (``hf_prompt_ids``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CHATML",
    "GPT2_TEMPLATE",
    "LLAMA_EXTRA_EOS_TEXT",
    "hf_prompt_ids",
    "write_family",
    "write_gpt2",
    "write_llama",
]

CHATML = (
    "{{ bos_token }}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
GPT2_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '<|endoftext|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
LLAMA_EXTRA_EOS_TEXT = "<|endoftext|>"
"""The second eos id of the Llama checkpoint's generation_config.json (its first: <|im_end|>)."""
CORPUS = [
    "Hello world, this is a tiny corpus for a tiny chat tokenizer.",
    "user: how are you? assistant: I am fine, thank you for asking.",
    "Ünïcödé tëxt, emoji 🙂🚀, 中文字符 and русский текст.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
]


def _tokenizer(directory: Path) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(CORPUS * 4, trainer)
    ids = {name: tk.token_to_id(name) for name in SPECIALS}
    tk.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", ids["<s>"])]),
        ]
    )
    tk.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHATML,
        "clean_up_tokenization_spaces": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    ids["vocab"] = tk.get_vocab_size()
    return ids


def write_llama(directory: Path, *, seed: int = 0, max_positions: int = 256) -> Path:
    """A random Llama checkpoint with a ChatML tokenizer in ``directory`` (created)."""
    import torch
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    ids = _tokenizer(directory)
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=ids["vocab"],
        max_position_embeddings=max_positions,
        bos_token_id=ids["<s>"],
        eos_token_id=[ids["<|im_end|>"], ids[LLAMA_EXTRA_EOS_TEXT]],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # larger weights than the default init, so greedy tokens are clear-cut
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(directory)
    return directory


def write_family(
    directory: Path, model_class: str, config_class: str, *, seed: int = 0, max_positions: int = 256, **config: Any
) -> Path:
    """A random ``transformers.<model_class>`` of ``transformers.<config_class>`` (2 layers, hidden 64, 4 query
    heads over 2 key/value heads, ``config`` on top) with the ChatML tokenizer of ``write_llama``, in ``directory``."""
    import torch
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    ids = _tokenizer(directory)
    shape: dict[str, Any] = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": ids["vocab"],
        "max_position_embeddings": max_positions,
        "bos_token_id": ids["<s>"],
        "eos_token_id": [ids["<|im_end|>"], ids[LLAMA_EXTRA_EOS_TEXT]],
        "pad_token_id": ids[LLAMA_EXTRA_EOS_TEXT],
    }
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**{**shape, **config}))
    with torch.no_grad():  # larger weights than the default init, so greedy tokens are clear-cut
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
            elif name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
    model.save_pretrained(directory)
    return directory


def write_gpt2(directory: Path, *, seed: int = 3, max_positions: int = 256) -> Path:
    """A random kael GPT-2 over kael-tiny's byte vocabulary, with GPT2_TEMPLATE."""
    import kael
    from kael_server.loading import bundled_model_dir

    kael.GPT(257, max_positions, 2, 2, 32, generator=kael.Generator().manual_seed(seed)).save_pretrained(directory)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(bundled_model_dir() / name, directory / name)
    config = {"chat_template": GPT2_TEMPLATE, "eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


def hf_prompt_ids(directory: Path, messages: Sequence[dict[str, Any]]) -> list[int]:
    """transformers' ids of the conversation with the generation prompt (the oracle)."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    out = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    if not isinstance(out, list):  # transformers 5 returns a BatchEncoding
        out = out["input_ids"]
    return [int(i) for i in out]
