"""What the tests/core/test_hf_tokenizer*.py files share: the offline tokenizer directories they build
(``KINDS``, each kind's writer in hf_fixtures, and ``write_tokenizer_dirs``, which writes every kind and GPT-2's
real vocabulary as ``tokenizer.json``), sample texts, and transformers' ``AutoTokenizer`` loaded and decoding
with its warnings silenced (``auto_tokenizer``, ``quiet_decode``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hf_fixtures import write_byte_level, write_gpt2, write_llama2, write_llama3

__all__ = ["KINDS", "TEXTS", "auto_tokenizer", "quiet_decode", "write_tokenizer_dirs"]

KINDS: dict[str, Callable[..., Path]] = {"byte_level": write_byte_level, "llama2": write_llama2, "llama3": write_llama3}

TEXTS = [
    "",
    "Hello world",
    " ",
    "   leading and trailing   ",
    "\n\n\t tabs\tand\r\nnewlines\n",
    "émoji 🙂🚀 中文 ñ €",
    "👩\u200d👩\u200d👧\u200d👦 family",
    "zzzq qqq ¿¡ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<s>[INST] hello [/INST] ok </s>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<|endoftext|>a<|endoftext|>",
    "<|im_end",
    "I'm sure they'll see we've done it.",
    "def f(x):\n    return x ** 2\n",
    "\x00\x01 control \x7f",
]


def auto_tokenizer(directory: Path) -> Any:
    """transformers' AutoTokenizer for ``directory`` (the fast tokenizer), loaded without warnings."""
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoTokenizer.from_pretrained(directory)


def quiet_decode(hf: Any, ids: list[int], **kwargs: Any) -> str:
    """``hf.decode(ids, **kwargs)`` without warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return str(hf.decode(ids, **kwargs))


def write_tokenizer_dirs(root: Path) -> dict[str, Path]:
    """A tokenizer directory of each of ``KINDS`` and GPT-2's, by name, under ``root``."""
    made = {name: write(root / name) for name, write in KINDS.items()}
    made["gpt2"] = write_gpt2(root / "gpt2")
    return made
