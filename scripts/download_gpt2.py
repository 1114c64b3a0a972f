"""Download GPT-2's published weights and tokenizer into a directory kael-server can serve.

    python scripts/download_gpt2.py --model gpt2 --out weights/gpt2
    kael-server --data weights/gpt2

A thin alias of ``scripts/download_model.py openai-community/<model>`` (plain HTTPS, no
extra packages). Needs network access to the Hugging Face Hub; kael's tests never call it.
Sizes: gpt2 (124M, 548 MB), gpt2-medium, gpt2-large, gpt2-xl.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import download_model

__all__ = ["MODELS", "main"]

MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="gpt2", choices=MODELS, help="which GPT-2 size (default gpt2)")
    parser.add_argument("--out", default=None, help="target directory (default weights/<model>)")
    args = parser.parse_args(argv)
    out = args.out or os.path.join("weights", args.model)
    return download_model.main([f"openai-community/{args.model}", "--out", out])


if __name__ == "__main__":
    sys.exit(main())
