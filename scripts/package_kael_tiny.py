"""Package a checkpoint as a bundled model: kael-tiny (examples/train_gpt.py) or kael-tiny-chat
(examples/train_llama.py, with ``--chat``).

    python scripts/package_kael_tiny.py CHECKPOINT_DIR [--command "how it was trained"]
    python scripts/package_kael_tiny.py CHECKPOINT_DIR --chat [--command "..."]

Copies the checkpoint's model files into kael_server/src/kael_server/models/kael-tiny/
(config.json, model.safetensors, vocab.json, merges.txt) or .../kael-tiny-chat/ (config.json,
generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json) and writes
its README.md from the checkpoint's trainer.json (held-out loss history, steps, time) with
samples drawn from the packaged model.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path
from typing import Any

import kael

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "kael_server" / "src" / "kael_server" / "models" / "kael-tiny"
FILES = ("config.json", "model.safetensors", "vocab.json", "merges.txt")
PROMPTS = (("def ", 1), ("class Parser:\n    def ", 2), ("import os\n", 3), ("    for ", 4))


def samples(model: kael.GPT, directory: Path, temperature: float, top_k: int, tokens: int) -> list[tuple[str, str]]:
    tok = kael.BpeTokenizer.from_directory(directory)
    out = []
    for prompt, seed in PROMPTS:
        gen = kael.Generator().manual_seed(seed)
        ids = model.generate(tok.encode(prompt), tokens, temperature=temperature, top_k=top_k, generator=gen)
        out.append((prompt, tok.decode_text(ids)))
    return out


def readme(directory: Path, state: dict[str, Any], command: str) -> str:
    cfg = state.get("config", {})
    model = kael.GPT.from_pretrained(directory)
    params = sum(p.numel() for p in model.parameters())
    size = (directory / "model.safetensors").stat().st_size
    loss = state["held_out_loss"]
    history = "\n".join(
        f"| {h['step']} | {h['seconds']:.0f} | {h['held_out_loss']:.4f} |" for h in state.get("history", [])
    )
    shown = "\n".join(
        f"\nPrompt `{p!r}`:\n\n```python\n{p}{s}\n```\n" for p, s in samples(model, directory, 0.7, 40, 300)
    )
    return f"""# kael-tiny

A GPT-2-architecture model trained by kael itself (`examples/train_gpt.py`, on the C++
backend `kael-backend-cpu`, on this repository's 2-core machine) on the source of the CPython
standard library that ships with Python 3.11 (PSF License; test directories excluded).
kael-server serves it when started without `--data`.

| | |
|---|---|
| architecture | GPT-2: {cfg.get("layers")} layers, {cfg.get("heads")} heads, dimension {cfg.get("dimension")}, context {cfg.get("context")} |
| tokenizer | bytes: GPT-2's byte-level BPE with no merges (256 byte tokens + `<|endoftext|>`) |
| parameters | {params:,} ({size / 1e6:.1f} MB of float32 safetensors) |
| training | {state["step"]:,} steps of {cfg.get("batch_size")} x {cfg.get("context")} bytes ({state["tokens"]:,} tokens), AdamW, cosine schedule with warm-up |
| training time | {state["seconds"] / 60:.1f} minutes on one core of a 2-core machine |
| held-out loss | **{loss:.4f} nats/byte** ({loss / math.log(2):.3f} bits/byte), on 5% of the files held out by path hash |

Reproduce: `{command}`, then `python scripts/package_kael_tiny.py DIR`.

## Held-out loss during training

| step | seconds | held-out loss |
|---|---|---|
{history}

## Samples (temperature 0.7, top-k 40, 300 bytes)
{shown}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--command", default=None, help="the command that trained the checkpoint")
    parser.add_argument("--chat", action="store_true", help="package kael-tiny-chat (examples/train_llama.py)")
    args = parser.parse_args()
    state = json.loads((args.checkpoint / "trainer.json").read_text())
    if args.chat:
        import package_chat_model

        print(package_chat_model.package(args.checkpoint, state, args.command or package_chat_model.COMMAND))
        return
    args.command = args.command or "python examples/train_gpt.py --out DIR"
    DEST.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copyfile(args.checkpoint / name, DEST / name)
    text = readme(DEST, state, args.command)
    (DEST / "README.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
