"""Download GPT-2's published weights and tokenizer into a directory kael-server can serve.

    pip install huggingface_hub
    python scripts/download_gpt2.py --model gpt2 --out weights/gpt2
    kael-server --data weights/gpt2

Needs network access to the Hugging Face Hub; kael's tests never call it. Sizes:
gpt2 (124M, 548 MB), gpt2-medium, gpt2-large, gpt2-xl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

FILES = ("config.json", "model.safetensors", "vocab.json", "merges.txt")
MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2", choices=MODELS, help="which GPT-2 size (default gpt2)")
    parser.add_argument("--out", default=None, help="target directory (default weights/<model>)")
    args = parser.parse_args(argv)
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        print("this script needs huggingface_hub: pip install huggingface_hub", file=sys.stderr)
        return 2
    out = args.out or os.path.join("weights", args.model)
    os.makedirs(out, exist_ok=True)
    repo = f"openai-community/{args.model}"
    for name in FILES:
        path = hf_hub_download(repo_id=repo, filename=name)
        shutil.copyfile(path, os.path.join(out, name))
        print(f"{name}: {os.path.getsize(os.path.join(out, name)):,} bytes", file=sys.stderr)
    with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    print(f"GPT-2 {args.model}: {cfg['n_layer']} layers, {cfg['n_embd']} dims -> kael-server --data {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
