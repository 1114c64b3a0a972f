"""What the tests/core/test_tokenizer*.py files share: GPT-2's tokenizer files (tests/data/gpt2-tokenizer),
its end-of-text token, hypothesis strategies for text (any text, and a dense mix of the characters the
pre-tokenizer's pattern tells apart) and the one-byte token ids of some bytes (``byte_token_ids``).
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import strategies as st
from kael.tokenizer._bytes import BYTE_TO_CHAR

__all__ = ["DATA", "EOT", "MIXED", "TEXT", "byte_token_ids"]

DATA = Path(__file__).resolve().parent.parent / "data" / "gpt2-tokenizer"
EOT = "<|endoftext|>"

TEXT = st.text(alphabet=st.characters(codec="utf-8"))
# A few characters of every kind the pattern tells apart (letters, numbers, Unicode
# whitespace and what is not, contraction letters, astral code points), densely mixed.
MIXED_ALPHABET = list(
    " \t\n\r\x0b\x0c\x1c\x85\xa0\u1680\u2000\u2028\u3000aZsdmtlvreé\u0301ß1²\u0663'!.,-_<|>"
    "\U0001f642\U00010400\U0001d7ce\U0002a6d6\ufffd"
)
MIXED = st.lists(st.sampled_from(MIXED_ALPHABET), max_size=60).map("".join)


def byte_token_ids(vocab: dict[str, int], data: bytes) -> list[int]:
    """The one-byte token ids for ``data``, through the vocabulary's byte table."""
    return [vocab[BYTE_TO_CHAR[b]] for b in data]
