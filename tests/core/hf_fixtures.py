"""Offline Hugging Face tokenizer directories for the tests, built with the ``tokenizers`` library.

Each ``write_*`` function trains a small tokenizer on a fixed corpus and writes
``tokenizer.json`` and ``tokenizer_config.json`` into a directory, laid out like a
family of real checkpoints:

* ``write_byte_level``: SmolLM2 / Qwen2 style, byte-level BPE with ``<|endoftext|>``,
  ``<|im_start|>``, ``<|im_end|>``;
* ``write_llama2``: Llama 2 / TinyLlama style, BPE with byte fallback (``<0xHH>``
  tokens in the vocabulary), Metaspace ``▁``, ``<unk>``/``<s>``/``</s>``, BOS added by
  a TemplateProcessing post-processor and ``add_bos_token``;
* ``write_llama3``: Llama 3 style, a regex split then byte-level BPE,
  ``<|begin_of_text|>`` added by the post-processor, ``<|eot_id|>`` as eos;
* ``write_phi3``: Phi-3 / Llama 2 style SentencePiece, a ``tokenizer.model`` trained with
  ``sentencepiece`` (BPE, byte fallback) and the ``tokenizer.json`` transformers converts it to,
  with Phi-3's added ``<|endoftext|>`` and ``<|end|>``;
* ``write_gpt2``: GPT-2's real vocabulary (tests/data/gpt2-tokenizer) saved by
  ``transformers.GPT2TokenizerFast`` as ``tokenizer.json``, plus ``vocab.json`` and
  ``merges.txt``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

__all__ = [
    "CORPUS",
    "GPT2_DATA",
    "write_byte_level",
    "write_gpt2",
    "write_llama2",
    "write_llama3",
    "write_phi3",
    "write_config",
]

GPT2_DATA = Path(__file__).resolve().parent.parent / "data" / "gpt2-tokenizer"

CORPUS = [
    "Hello world, this is a tiny corpus for a tiny tokenizer.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Ünïcödé tëxt, emoji 🙂🚀, 中文字符 and русский текст.",
    "  spaces   and\ttabs\n\nnewlines\r\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "I'm sure you're right; they'll see we've done it, she'd say.",
]

_LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def write_config(directory: Path, **entries: Any) -> None:
    """Write ``tokenizer_config.json`` with ``entries``."""
    (directory / "tokenizer_config.json").write_text(json.dumps(entries, ensure_ascii=False), encoding="utf-8")


def _train_byte_level(tk: Tokenizer, vocab_size: int, specials: list[str]) -> None:
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(CORPUS * 4, trainer)


def write_byte_level(directory: Path, **config: Any) -> Path:
    """A SmolLM2/Qwen2-style byte-level BPE tokenizer."""
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    _train_byte_level(tk, 420, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    directory.mkdir(parents=True, exist_ok=True)
    tk.save(str(directory / "tokenizer.json"))
    entries: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|im_end|>",
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
    }
    write_config(directory, **{**entries, **config})
    return directory


def write_llama2(directory: Path, **config: Any) -> Path:
    """A Llama-2/TinyLlama-style tokenizer: byte-fallback BPE over Metaspace pieces."""
    trained = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    trainer = trainers.BpeTrainer(
        vocab_size=520, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=60, show_progress=False
    )
    trained.train_from_iterator(CORPUS * 4, trainer)
    raw = json.loads(trained.to_str())
    # As in Llama 2's vocabulary: <unk> <s> </s>, the 256 byte tokens, then the merges' tokens.
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for token, _ in sorted(raw["model"]["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in raw["model"]["merges"]]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tk.add_special_tokens(["<unk>", "<s>", "</s>"])
    tk.normalizer = None
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tk.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", 1)]
    )
    directory.mkdir(parents=True, exist_ok=True)
    tk.save(str(directory / "tokenizer.json"))
    entries: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "legacy": False,
    }
    write_config(directory, **{**entries, **config})
    return directory


def write_llama3(directory: Path, **config: Any) -> Path:
    """A Llama-3-style tokenizer: a regex split, byte-level BPE, BOS from the post-processor."""
    tk = Tokenizer(models.BPE(ignore_merges=True))
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=Regex(_LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    _train_byte_level(tk, 460, [])
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tk.add_special_tokens(specials)
    bot = tk.token_to_id("<|begin_of_text|>")
    tk.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                special_tokens=[("<|begin_of_text|>", bot)],
            ),
        ]
    )
    directory.mkdir(parents=True, exist_ok=True)
    tk.save(str(directory / "tokenizer.json"))
    entries: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "clean_up_tokenization_spaces": True,
    }
    write_config(directory, **{**entries, **config})
    return directory


def write_phi3(directory: Path, vocab_size: int = 420) -> Path:
    """A Phi-3-style SentencePiece tokenizer (needs ``sentencepiece`` and ``transformers``): ``tokenizer.model``
    trained here (BPE with byte fallback, ``<unk> <s> </s>`` = 0, 1, 2, the 256 ``<0xXX>`` tokens, ``vocab_size``
    pieces in all), the ``tokenizer.json`` transformers converts it to, and Phi-3's added special tokens
    ``<|endoftext|>`` and ``<|end|>`` after the pieces; ``</s>`` and ``<|end|>`` rstrip (swallow the whitespace
    after them) as in Phi-3's tokenizer.json; ``tokenizer_class`` LlamaTokenizer, BOS added.

    NOTE [legacy SentencePiece normalizer]: SentencePiece (and llama.cpp's SPM tokenizer, and kael's GGUF one)
    prefixes ``▁`` to the text and to every stretch after a special token, even one already starting with a space.
    transformers 5 converts a tokenizer.model to a ``Metaspace`` pre-tokenizer, which skips the prefix when the
    text starts with a space (``" done"`` after ``<|endoftext|>`` then loses a ``▁``); the tokenizer.json files
    Llama 2 and Phi-3 ship have the legacy normalizer (Prepend ``▁``, Replace space by ``▁``, no pre-tokenizer)
    that always prefixes. This fixture writes that layout, so its ids are SentencePiece's.
    """
    import io

    import sentencepiece as spm
    from transformers import AddedToken, AutoTokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 4), model_writer=model, vocab_size=vocab_size, model_type="bpe",
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, byte_fallback=True, character_coverage=1.0,
        normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True, minloglevel=2,
    )  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.model").write_bytes(model.getvalue())
    entries = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True}
    write_config(directory, tokenizer_class="LlamaTokenizer", add_eos_token=False, legacy=True, **entries)
    tk = AutoTokenizer.from_pretrained(directory)
    added = [AddedToken("<|endoftext|>", special=True, normalized=False)]
    added.append(AddedToken("<|end|>", rstrip=True, special=True, normalized=False))
    tk.add_tokens(added, special_tokens=True)
    tk.save_pretrained(directory)
    path = directory / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    spec["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"}, replace]}
    spec["pre_tokenizer"] = None  # NOTE [legacy SentencePiece normalizer]
    for a in spec["added_tokens"]:  # Phi-3's tokenizer.json: </s> rstrips too
        a["rstrip"] = a["content"] in ("</s>", "<|end|>")
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    write_config(directory, tokenizer_class="LlamaTokenizer", add_eos_token=False, legacy=True, **entries)
    return directory


def write_gpt2(directory: Path) -> Path:
    """GPT-2's tokenizer as ``transformers`` saves it (``tokenizer.json``), plus vocab.json and merges.txt."""
    from transformers import GPT2TokenizerFast

    vocab = json.loads((GPT2_DATA / "vocab.json").read_text(encoding="utf-8"))
    lines = (GPT2_DATA / "merges.txt").read_text(encoding="utf-8").splitlines()
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    GPT2TokenizerFast(vocab=vocab, merges=merges).save_pretrained(directory)
    shutil.copy(GPT2_DATA / "vocab.json", directory / "vocab.json")
    shutil.copy(GPT2_DATA / "merges.txt", directory / "merges.txt")
    return directory
