"""SentencePiece vocabularies in GGUF (``tokenizer.ggml.model = "llama"``) as ``tokenizers`` parts.

llama.cpp's ``llm_tokenizer_spm`` replaces spaces by ``▁`` (after prepending one when
``tokenizer.ggml.add_space_prefix``, default true, at the start of the text and after each
special token), then repeatedly merges the adjacent pair whose concatenation is the
highest-scoring token (ties: the leftmost), and spells a piece that is not a token as its
``<0xXX>`` byte tokens. That is a BPE whose merges are every split ``a b`` of every token
``a+b`` into two tokens, ranked by the score of ``a+b`` (highest first) with byte fallback,
which is how Hugging Face's ``LlamaTokenizerFast`` converter writes it; ``spm_parts`` builds
that model, the normalizer (Prepend ``▁``, Replace space by ``▁``) and the decoder (``▁`` to
space, byte fallback, fuse, strip the one prefixed space).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["SPACE", "spm_parts"]

SPACE = "\u2581"
"""SentencePiece's visible space, ``▁``."""


def _merges(tokens: Sequence[str], scores: Sequence[float], vocab: dict[str, int]) -> list[list[str]]:
    """Every ``[a, b]`` with ``a``, ``b`` and ``a+b`` tokens, highest score of ``a+b`` first."""
    ranked: list[tuple[float, int, int, int, str, str]] = []
    for i, t in enumerate(tokens):
        for cut in range(1, len(t)):
            a, b = t[:cut], t[cut:]
            ia, ib = vocab.get(a), vocab.get(b)
            if ia is not None and ib is not None and vocab.get(t) == i:
                ranked.append((-float(scores[i]), i, ia, ib, a, b))
    ranked.sort()
    return [[a, b] for *_, a, b in ranked]


def spm_parts(
    tokens: Sequence[str],
    scores: Sequence[float],
    vocab: dict[str, int],
    unk: int | None,
    add_space_prefix: bool,
) -> dict[str, Any]:
    """The ``normalizer``, ``pre_tokenizer``, ``decoder`` and ``model`` of a ``tokenizer.json``
    encoding and decoding as llama.cpp's SentencePiece tokenizer over this vocabulary."""
    normalizers: list[dict[str, Any]] = []
    if add_space_prefix:
        normalizers.append({"type": "Prepend", "prepend": SPACE})
    normalizers.append({"type": "Replace", "pattern": {"String": " "}, "content": SPACE})
    decoders: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if add_space_prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": tokens[unk] if unk is not None else None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": _merges(tokens, scores, vocab),
        },
    }
